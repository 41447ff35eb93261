//! KVM ioctls that kvm-ioctls 0.25 lacks (or wraps with a per-call allocation), on top of
//! kvm-bindings' types: dirty-log harvest into caller buffers, `KVM_CLEAR_DIRTY_LOG`,
//! `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, and the per-vCPU binary statistics
//! (`KVM_GET_STATS_FD`).

use crate::error::Error;
use kvm_bindings::{
    kvm_clear_dirty_log, kvm_clear_dirty_log__bindgen_ty_1, kvm_dirty_log,
    kvm_dirty_log__bindgen_ty_1, kvm_enable_cap, kvm_stats_desc, kvm_stats_header, KVMIO,
    KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, KVM_DIRTY_LOG_INITIALLY_SET,
    KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
};
use kvm_ioctls::{VcpuFd, VmFd};
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use vmm_sys_util::ioctl::{ioctl, ioctl_with_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_iow_nr, ioctl_iowr_nr};

ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_dirty_log);
ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);
ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);

/// The bits of `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` this host supports (0 when absent):
/// the selftests' `dirty_log_manual_caps`.
pub fn manual_protect_caps(vm: &VmFd) -> u64 {
    let caps = vm.check_extension_raw(u64::from(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2));
    (caps.max(0) as u64)
        & u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET)
}

/// Enables manual dirty-log protection: `KVM_GET_DIRTY_LOG` then only copies the bitmap
/// and `KVM_CLEAR_DIRTY_LOG` re-protects. `initially_set` adds `KVM_DIRTY_LOG_INITIALLY_SET`
/// (bitmaps start all-ones and nothing is write-protected until the first clear).
///
/// # Errors
/// [`Error::CapabilityMissing`] when the host lacks the capability (or `initially_set` is
/// asked for and not offered); [`Error::Ioctl`] when `KVM_ENABLE_CAP` fails.
pub fn enable_manual_protect(vm: &VmFd, initially_set: bool) -> Result<u64, Error> {
    let supported = manual_protect_caps(vm);
    let mut want = u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE);
    if initially_set {
        want |= u64::from(KVM_DIRTY_LOG_INITIALLY_SET);
    }
    if supported & want != want {
        return Err(Error::CapabilityMissing {
            name: if initially_set {
                "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 (with KVM_DIRTY_LOG_INITIALLY_SET)"
            } else {
                "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2"
            },
        });
    }
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
        ..Default::default()
    };
    cap.args[0] = want;
    vm.enable_cap(&cap)
        .map_err(|e| Error::from_errno("KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2)", e))?;
    Ok(want)
}

/// u64 words of the dirty bitmap of a slot with `pages` pages (KVM rounds up to 64 bits).
pub fn bitmap_words(pages: u64) -> usize {
    pages.div_ceil(64) as usize
}

/// `KVM_GET_DIRTY_LOG` for `slot` into `bitmap` (one bit per page, little-endian words).
///
/// # Errors
/// [`Error::InvalidArgument`] when `bitmap` is shorter than the slot needs;
/// [`Error::Ioctl`] when KVM refuses (ENOENT: no such slot or logging off).
pub fn get_dirty_log(vm: &VmFd, slot: u32, pages: u64, bitmap: &mut [u64]) -> Result<(), Error> {
    if bitmap.len() < bitmap_words(pages) {
        return Err(Error::invalid(
            "bitmap",
            format!("{} words for a {pages}-page slot", bitmap.len()),
        ));
    }
    let log = kvm_dirty_log {
        slot,
        padding1: 0,
        __bindgen_anon_1: kvm_dirty_log__bindgen_ty_1 {
            dirty_bitmap: bitmap.as_mut_ptr().cast(),
        },
    };
    // SAFETY: `log` is a valid kvm_dirty_log; KVM writes at most ALIGN(npages, 64)/8 bytes of
    // the slot (whose page count is `pages`) to `dirty_bitmap`, which the length check above
    // guarantees is writable and exclusively borrowed for the call.
    let rc = unsafe { ioctl_with_ref(vm, KVM_GET_DIRTY_LOG(), &log) };
    if rc < 0 {
        return Err(Error::last_os("KVM_GET_DIRTY_LOG"));
    }
    Ok(())
}

/// `KVM_CLEAR_DIRTY_LOG` of the pages set in `bitmap`, from page `first_page` for
/// `num_pages` pages of `slot`: clears their dirty bits and write-protects them again.
///
/// # Errors
/// [`Error::InvalidArgument`] when `first_page` is not a multiple of 64, `bitmap` is too
/// short or `num_pages` does not fit in 32 bits; [`Error::Ioctl`] when KVM refuses.
pub fn clear_dirty_log(
    vm: &VmFd,
    slot: u32,
    first_page: u64,
    num_pages: u64,
    bitmap: &[u64],
) -> Result<(), Error> {
    if !first_page.is_multiple_of(64) {
        return Err(Error::invalid(
            "first_page",
            format!("{first_page} is not a multiple of 64"),
        ));
    }
    if bitmap.len() < bitmap_words(num_pages) {
        return Err(Error::invalid(
            "bitmap",
            format!("{} words for {num_pages} pages", bitmap.len()),
        ));
    }
    let num_pages_u32 = u32::try_from(num_pages)
        .map_err(|_| Error::invalid("num_pages", format!("{num_pages} exceeds u32")))?;
    let clear = kvm_clear_dirty_log {
        slot,
        num_pages: num_pages_u32,
        first_page,
        __bindgen_anon_1: kvm_clear_dirty_log__bindgen_ty_1 {
            // KVM only reads the bitmap for CLEAR; the field is declared `*mut` in the uapi.
            dirty_bitmap: bitmap.as_ptr().cast_mut().cast(),
        },
    };
    // SAFETY: `clear` is a valid kvm_clear_dirty_log; KVM reads ALIGN(num_pages, 64)/8 bytes
    // from `dirty_bitmap` (checked above to be within `bitmap`) and writes nothing back.
    let rc = unsafe { ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &clear) };
    if rc < 0 {
        return Err(Error::last_os("KVM_CLEAR_DIRTY_LOG"));
    }
    Ok(())
}

/// One vCPU's binary statistics file (`KVM_GET_STATS_FD`), with the offsets of the
/// counters this crate reports.
#[derive(Debug)]
pub struct VcpuStats {
    file: File,
    /// (name, byte offset in the file) of each counter found.
    counters: Vec<(&'static str, u64)>,
}

/// A snapshot of the vCPU counters this crate reads; `None` where KVM has no such stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuCounters {
    /// `exits`: every VM exit, handled in the kernel or not.
    pub exits: Option<u64>,
    /// `pf_taken`: page faults KVM handled.
    pub pf_taken: Option<u64>,
    /// `pf_fixed`: faults that installed or fixed a mapping (one per write-protect fault).
    pub pf_fixed: Option<u64>,
    /// `mmio_exits`: exits to userspace for MMIO.
    pub mmio_exits: Option<u64>,
}

impl VcpuCounters {
    /// `self - earlier`, counter by counter.
    pub fn since(&self, earlier: &VcpuCounters) -> VcpuCounters {
        let d = |a: Option<u64>, b: Option<u64>| Some(a?.wrapping_sub(b?));
        VcpuCounters {
            exits: d(self.exits, earlier.exits),
            pf_taken: d(self.pf_taken, earlier.pf_taken),
            pf_fixed: d(self.pf_fixed, earlier.pf_fixed),
            mmio_exits: d(self.mmio_exits, earlier.mmio_exits),
        }
    }

    /// Counter-by-counter sum; a counter missing on one side counts as absent there, so
    /// summing from [`VcpuCounters::default`] works.
    pub fn add(&self, other: &VcpuCounters) -> VcpuCounters {
        let s = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.wrapping_add(b)),
            (a, None) => a,
            (None, b) => b,
        };
        VcpuCounters {
            exits: s(self.exits, other.exits),
            pf_taken: s(self.pf_taken, other.pf_taken),
            pf_fixed: s(self.pf_fixed, other.pf_fixed),
            mmio_exits: s(self.mmio_exits, other.mmio_exits),
        }
    }
}

const COUNTER_NAMES: [&str; 4] = ["exits", "pf_taken", "pf_fixed", "mmio_exits"];

impl VcpuStats {
    /// Opens the statistics of `vcpu` and locates the counters.
    ///
    /// # Errors
    /// [`Error::CapabilityMissing`] when the kernel has no binary stats
    /// (`KVM_CAP_BINARY_STATS_FD`); [`Error::Ioctl`] when reading the descriptors fails.
    pub fn open(vcpu: &VcpuFd) -> Result<Self, Error> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1; the vCPU fd
        // is valid for the call.
        let fd = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(Error::CapabilityMissing {
                name: "KVM_CAP_BINARY_STATS_FD",
            });
        }
        // SAFETY: `fd` is a fresh descriptor returned by KVM that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut header_bytes = [0u8; std::mem::size_of::<kvm_stats_header>()];
        file.read_exact_at(&mut header_bytes, 0)
            .map_err(|e| io_error("read(kvm stats header)", &e))?;
        let word = |i: usize| {
            u32::from_ne_bytes(
                header_bytes[i * 4..i * 4 + 4]
                    .try_into()
                    .unwrap_or_default(),
            )
        };
        let (name_size, num_desc, desc_offset, data_offset) = (word(1), word(2), word(4), word(5));
        let desc_size = std::mem::size_of::<kvm_stats_desc>() + name_size as usize;
        let mut descs = vec![0u8; desc_size * num_desc as usize];
        file.read_exact_at(&mut descs, u64::from(desc_offset))
            .map_err(|e| io_error("read(kvm stats descriptors)", &e))?;
        let mut counters = Vec::new();
        for desc in descs.chunks_exact(desc_size) {
            let offset = u32::from_ne_bytes(desc[8..12].try_into().unwrap_or_default());
            let name_bytes = &desc[16..];
            let len = name_bytes
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_bytes.len());
            let name = &name_bytes[..len];
            if let Some(known) = COUNTER_NAMES.iter().find(|n| n.as_bytes() == name) {
                counters.push((*known, u64::from(data_offset) + u64::from(offset)));
            }
        }
        Ok(VcpuStats { file, counters })
    }

    /// Reads the current counter values.
    ///
    /// # Errors
    /// [`Error::Ioctl`] (`pread`) when the statistics file cannot be read.
    pub fn read(&self) -> Result<VcpuCounters, Error> {
        let mut out = VcpuCounters::default();
        for &(name, offset) in &self.counters {
            let mut value = [0u8; 8];
            self.file
                .read_exact_at(&mut value, offset)
                .map_err(|e| io_error("pread(kvm stats)", &e))?;
            let value = Some(u64::from_ne_bytes(value));
            match name {
                "exits" => out.exits = value,
                "pf_taken" => out.pf_taken = value,
                "pf_fixed" => out.pf_fixed = value,
                _ => out.mmio_exits = value,
            }
        }
        Ok(out)
    }
}

fn io_error(op: &'static str, e: &std::io::Error) -> Error {
    Error::Ioctl {
        op,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}
