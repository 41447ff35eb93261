//! A vCPU's full state read from KVM and written back.
//!
//! Read: the pending events and the run state first (`KVM_GET_MP_STATE`
//! delivers a pending INIT or SIPI, which changes CS and RIP), then the
//! general registers, the XSAVE area and XCRs, the special registers, the
//! MSRs, the local APIC and the debug registers.
//!
//! Written in the order of QEMU's x86 `kvm_arch_put_registers`, with the
//! local APIC added (QEMU sets it from its APIC device before that
//! function runs): the special registers first (EFER and the APIC base,
//! which the MSRs and the APIC depend on), the general registers, the
//! XSAVE area and XCRs, the MSRs but the TSC deadline, the local APIC
//! (after the APIC base), the pending events, the run state (KVM checks
//! a run state of INIT or SIPI received against the SMM state the events
//! carry, so they come first), the TSC deadline (it arms the APIC's
//! timer, so after the APIC), and the debug registers.

use super::cpu_parts::{FpuState, MAX_MSRS, MAX_XSAVE_BYTES, XSAVE_LEGACY_BYTES};
use super::cpu_state::VcpuState;
use crate::Error;
use kvm_bindings::{kvm_mp_state, kvm_msr_entry, kvm_xsave, kvm_xsave2, Msrs, Xsave};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};

/// `IA32_TSC_DEADLINE`: set after the local APIC.
pub const MSR_TSC_DEADLINE: u32 = 0x6e0;

/// What the host's KVM lets a vCPU's state carry, found once per VM.
///
/// Only [`StateCaps::probe`] builds one with an XSAVE area, from KVM's own
/// answer: [`save`] and [`restore`] size the buffer KVM writes and reads
/// from it, so a caller cannot choose that size:
///
/// ```compile_fail
/// let caps = s2mmu_kvm::migrate::vcpu_io::StateCaps {
///     xsave_bytes: 64,
///     xcrs: false,
///     msrs: Vec::new(),
/// };
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateCaps {
    xsave_bytes: usize,
    xcrs: bool,
    msrs: Vec<u32>,
}

impl StateCaps {
    /// Nothing to carry but the registers and the FPU (`KVM_GET_FPU`):
    /// a VM's caps before [`StateCaps::probe`] has run.
    pub(crate) fn none() -> StateCaps {
        StateCaps {
            xsave_bytes: 0,
            xcrs: false,
            msrs: Vec::new(),
        }
    }

    /// Bytes of the XSAVE area: `KVM_CAP_XSAVE2`'s size, 4096 with only
    /// `KVM_CAP_XSAVE`, 0 without either (the FPU is carried then).
    pub fn xsave_bytes(&self) -> usize {
        self.xsave_bytes
    }

    /// `KVM_CAP_XCRS`.
    pub fn xcrs(&self) -> bool {
        self.xcrs
    }

    /// The MSRs of `KVM_GET_MSR_INDEX_LIST` that a vCPU of the VM reads.
    pub fn msrs(&self) -> &[u32] {
        &self.msrs
    }

    /// The host's, with the MSR list filtered by reading it on `probe`
    /// (a vCPU of `vm` that has not run).
    ///
    /// `probe` existing matters for the XSAVE size: KVM locks the
    /// process's guest XSTATE permissions when its first vCPU is created,
    /// so the `KVM_CAP_XSAVE2` size read here bounds every vCPU's area in
    /// this process from then on.
    ///
    /// # Errors
    /// `KVM_GET_MSR_INDEX_LIST` or `KVM_GET_MSRS` refused; an XSAVE area
    /// under [`XSAVE_LEGACY_BYTES`] (but not 0) or over [`MAX_XSAVE_BYTES`].
    pub fn probe(kvm: &Kvm, vm: &VmFd, probe: &VcpuFd) -> Result<StateCaps, Error> {
        let xsave2 = usize::try_from(vm.check_extension_int(Cap::Xsave2)).unwrap_or(0);
        let xsave_bytes = if xsave2 > 0 {
            xsave2.max(XSAVE_LEGACY_BYTES)
        } else if kvm.check_extension(Cap::Xsave) {
            XSAVE_LEGACY_BYTES
        } else {
            0
        };
        check_xsave_bytes(xsave_bytes)?;
        let list = kvm
            .get_msr_index_list()
            .map_err(|e| Error::from_errno("KVM_GET_MSR_INDEX_LIST", e))?;
        let mut msrs: Vec<u32> = list.as_slice().iter().copied().take(MAX_MSRS).collect();
        // KVM_GET_MSRS reads up to the first MSR it cannot: drop that one
        // and read on from there.
        let mut from = 0;
        while from < msrs.len() {
            let n = read_msrs(probe, &msrs[from..])?.len();
            if from + n == msrs.len() {
                break;
            }
            msrs.remove(from + n);
            from += n;
        }
        Ok(StateCaps {
            xsave_bytes,
            xcrs: kvm.check_extension(Cap::Xcrs),
            msrs,
        })
    }
}

/// An XSAVE size `save` and `restore` can use: 0 (no XSAVE), or from
/// [`XSAVE_LEGACY_BYTES`] to [`MAX_XSAVE_BYTES`].
fn check_xsave_bytes(n: usize) -> Result<(), Error> {
    if n != 0 && n < XSAVE_LEGACY_BYTES {
        let why = format!("{n} bytes, less than {XSAVE_LEGACY_BYTES}");
        return Err(Error::invalid("xsave area", why));
    }
    if n > MAX_XSAVE_BYTES {
        let why = format!("{n} bytes, more than {MAX_XSAVE_BYTES}");
        return Err(Error::invalid("xsave area", why));
    }
    Ok(())
}

fn msr_list(entries: impl Iterator<Item = (u32, u64)>) -> Result<Msrs, Error> {
    let v: Vec<kvm_msr_entry> = entries
        .map(|(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    Msrs::from_entries(&v).map_err(|_| Error::invalid("msrs", format!("{} entries", v.len())))
}

/// The MSRs `indices` reads, up to the first it cannot read.
fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<(u32, u64)>, Error> {
    let mut m = msr_list(indices.iter().map(|i| (*i, 0)))?;
    let n = fd
        .get_msrs(&mut m)
        .map_err(|e| Error::from_errno("KVM_GET_MSRS", e))?;
    Ok(m.as_slice()[..n]
        .iter()
        .map(|e| (e.index, e.data))
        .collect())
}

fn ioctl<T>(op: &'static str, r: Result<T, kvm_ioctls::Error>) -> Result<T, Error> {
    r.map_err(|e| Error::from_errno(op, e))
}

/// The XSAVE area (or the FPU) of `fd`.
fn save_fpu(fd: &VcpuFd, caps: &StateCaps) -> Result<FpuState, Error> {
    if caps.xsave_bytes == 0 {
        return Ok(FpuState::Fpu(Box::new(ioctl("KVM_GET_FPU", fd.get_fpu())?)));
    }
    if caps.xsave_bytes == XSAVE_LEGACY_BYTES {
        let x = ioctl("KVM_GET_XSAVE", fd.get_xsave())?;
        return Ok(FpuState::Xsave(x.region.to_vec()));
    }
    let extra = (caps.xsave_bytes - XSAVE_LEGACY_BYTES).div_ceil(4);
    let mut x = Xsave::new(extra).map_err(|_| Error::invalid("xsave area", "too large"))?;
    // SAFETY: KVM_GET_XSAVE2 writes the vCPU's uABI XSAVE size, which is
    // at most the `KVM_CAP_XSAVE2` size of this process's guest XSTATE
    // permissions. `caps` can only come from `StateCaps::probe` (its
    // fields are private), which read that size while a vCPU existed, so
    // after KVM had locked those permissions for the process: no vCPU's
    // area can outgrow it. `probe` checked it is at least the legacy
    // 4096 bytes, and `x` holds the legacy region plus `extra` words,
    // i.e. at least `caps.xsave_bytes`.
    ioctl("KVM_GET_XSAVE2", unsafe { fd.get_xsave2(&mut x) })?;
    let mut words = x.as_fam_struct_ref().xsave.region.to_vec();
    words.extend_from_slice(x.as_slice());
    Ok(FpuState::Xsave(words))
}

/// Every part of `fd`'s state, read in the order of the module's text.
///
/// # Errors
/// The KVM ioctl that refused.
pub fn save(fd: &VcpuFd, caps: &StateCaps) -> Result<VcpuState, Error> {
    let events = ioctl("KVM_GET_VCPU_EVENTS", fd.get_vcpu_events())?;
    let mp_state = ioctl("KVM_GET_MP_STATE", fd.get_mp_state())?.mp_state;
    let regs = ioctl("KVM_GET_REGS", fd.get_regs())?;
    let fpu = save_fpu(fd, caps)?;
    let xcrs = if caps.xcrs {
        Some(ioctl("KVM_GET_XCRS", fd.get_xcrs())?)
    } else {
        None
    };
    let sregs = ioctl("KVM_GET_SREGS", fd.get_sregs())?;
    let msrs = read_msrs(fd, &caps.msrs)?;
    if msrs.len() != caps.msrs.len() {
        let i = caps.msrs[msrs.len()];
        return Err(Error::invalid("msrs", format!("KVM read no MSR {i:#x}")));
    }
    Ok(VcpuState {
        regs,
        sregs,
        fpu: Some(fpu),
        xcrs,
        msrs,
        lapic: Some(ioctl("KVM_GET_LAPIC", fd.get_lapic())?),
        events: Some(events),
        debugregs: Some(ioctl("KVM_GET_DEBUGREGS", fd.get_debug_regs())?),
        mp_state: Some(mp_state),
    })
}

/// Sets the XSAVE area (or the FPU) of `fd`.
fn restore_fpu(fd: &VcpuFd, fpu: &FpuState, caps: &StateCaps) -> Result<(), Error> {
    let words = match (fpu, caps.xsave_bytes) {
        (FpuState::Fpu(f), _) => return ioctl("KVM_SET_FPU", fd.set_fpu(f)),
        (FpuState::Xsave(_), 0) => {
            return Err(Error::invalid("xsave area", "this host has no XSAVE"))
        }
        (FpuState::Xsave(w), n) if w.len() * 4 > n => {
            let why = format!("{} bytes, this host's area is {n}", w.len() * 4);
            return Err(Error::invalid("xsave area", why));
        }
        (FpuState::Xsave(w), _) => w,
    };
    let mut region = [0u32; XSAVE_LEGACY_BYTES / 4];
    let (head, tail) = words.split_at(words.len().min(region.len()));
    region[..head.len()].copy_from_slice(head);
    let legacy = kvm_xsave {
        region,
        ..Default::default()
    };
    let extra = (caps.xsave_bytes - XSAVE_LEGACY_BYTES).div_ceil(4);
    let mut x = Xsave::from_header(kvm_xsave2::from(legacy))
        .map_err(|_| Error::invalid("xsave area", "no header"))?;
    for i in 0..extra {
        x.push(tail.get(i).copied().unwrap_or(0))
            .map_err(|_| Error::invalid("xsave area", "too large"))?;
    }
    // SAFETY: KVM_SET_XSAVE reads the vCPU's uABI XSAVE size, at most the
    // `KVM_CAP_XSAVE2` size that `StateCaps::probe` (the only builder of
    // `caps`) read after KVM had locked this process's guest XSTATE
    // permissions; `caps.xsave_bytes` is at least 4096 here (0 returned
    // above, `probe` refuses 1..4096) and `x` holds the legacy region
    // plus `extra` words: at least that many bytes.
    ioctl("KVM_SET_XSAVE", unsafe { fd.set_xsave2(&x) })
}

/// Writes every part of `st` that is present into `fd`, in KVM's order
/// (see the module's text).
///
/// # Errors
/// The KVM ioctl that refused, or a part this host cannot take (an XSAVE
/// area larger than its own).
pub fn restore(fd: &VcpuFd, st: &VcpuState, caps: &StateCaps) -> Result<(), Error> {
    ioctl("KVM_SET_SREGS", fd.set_sregs(&st.sregs))?;
    ioctl("KVM_SET_REGS", fd.set_regs(&st.regs))?;
    if let Some(f) = &st.fpu {
        restore_fpu(fd, f, caps)?;
    }
    if let Some(x) = &st.xcrs {
        ioctl("KVM_SET_XCRS", fd.set_xcrs(x))?;
    }
    let (deadline, msrs): (Vec<_>, Vec<_>) =
        st.msrs.iter().partition(|(i, _)| *i == MSR_TSC_DEADLINE);
    set_msrs(fd, &msrs)?;
    if let Some(l) = &st.lapic {
        ioctl("KVM_SET_LAPIC", fd.set_lapic(l))?;
    }
    if let Some(e) = &st.events {
        ioctl("KVM_SET_VCPU_EVENTS", fd.set_vcpu_events(e))?;
    }
    if let Some(m) = st.mp_state {
        ioctl(
            "KVM_SET_MP_STATE",
            fd.set_mp_state(kvm_mp_state { mp_state: m }),
        )?;
    }
    set_msrs(fd, &deadline)?;
    if let Some(d) = &st.debugregs {
        ioctl("KVM_SET_DEBUGREGS", fd.set_debug_regs(d))?;
    }
    Ok(())
}

fn set_msrs(fd: &VcpuFd, msrs: &[&(u32, u64)]) -> Result<(), Error> {
    if msrs.is_empty() {
        return Ok(());
    }
    let list = msr_list(msrs.iter().map(|m| **m))?;
    let n = ioctl("KVM_SET_MSRS", fd.set_msrs(&list))?;
    if n != msrs.len() {
        let (i, v) = msrs[n];
        let why = format!("KVM refused MSR {i:#x} = {v:#x}");
        return Err(Error::invalid("msrs", why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xsave_size_under_the_legacy_area_is_refused() {
        for ok in [0, XSAVE_LEGACY_BYTES, 11008, MAX_XSAVE_BYTES] {
            assert!(check_xsave_bytes(ok).is_ok(), "{ok}");
        }
        for bad in [1, 64, XSAVE_LEGACY_BYTES - 1, MAX_XSAVE_BYTES + 1] {
            let e = check_xsave_bytes(bad).unwrap_err();
            assert!(e.to_string().contains("xsave area"), "{bad}: {e}");
        }
        let none = StateCaps::none();
        assert_eq!((none.xsave_bytes(), none.xcrs()), (0, false));
        assert!(none.msrs().is_empty());
    }
}
