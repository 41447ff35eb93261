//! A KVM VM as the migration library's [`SessionVm`]: one memslot per RAM
//! region, and KVM's own dirty log in either form, the bitmap with manual
//! protect (`KVM_GET_DIRTY_LOG` copies, `KVM_CLEAR_DIRTY_LOG` re-protects)
//! or the per-vCPU dirty rings (`KVM_RESET_DIRTY_RINGS` re-protects).
//! The VM has KVM's in-kernel interrupt controllers (`KVM_CREATE_IRQCHIP`:
//! a local APIC per vCPU, an IOAPIC, a PIC), as a VMM's VM does, so a
//! vCPU's local APIC is part of its state.

use super::cpu_state::ClockState;
use super::ram::KvmRam;
use super::vcpu_io::StateCaps;
use crate::dirty_ring::{self, DirtyRing, RingResetter};
use crate::{sys, Error};
use kvm_bindings::{
    kvm_clock_data, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use s2mmu_migrate::vm::{RamSlot, RingEntry, SessionVm, VmError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which of KVM's dirty logs the VM keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmDirtyLog {
    /// Per-slot bitmaps with `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`
    /// (the session's `Harvest::Bitmap`).
    Bitmap,
    /// Per-vCPU rings of `entries` entries (`KVM_CAP_DIRTY_LOG_RING`;
    /// the session's `Harvest::Ring`).
    Ring {
        /// Entries per vCPU: a power of two in 1024..=65536.
        entries: u32,
    },
}

/// A VM's vCPUs as created, before they run: only [`super::vcpus::KvmVcpus`]
/// runs them, and it keeps the VM (and so the memory its memslots name)
/// alive for as long as they exist.
#[derive(Debug)]
pub struct NewVcpus {
    pub(super) fds: Vec<VcpuFd>,
    pub(super) vm: Arc<KvmVm>,
}

impl NewVcpus {
    /// The vCPUs, to set their registers (`KVM_SET_REGS`, ...) before they run.
    pub fn fds(&self) -> &[VcpuFd] {
        &self.fds
    }
}

/// A KVM VM with its RAM in memslots `first_slot..`, one per region.
#[derive(Debug)]
pub struct KvmVm {
    // Field order matters for drop: the VM fd (and its slots and rings)
    // goes before the memory.
    vm: VmFd,
    rings: Mutex<Vec<DirtyRing>>,
    resetter: Option<RingResetter>,
    ring_full: Arc<[AtomicBool]>,
    log: KvmDirtyLog,
    first_slot: u32,
    slots: Vec<RamSlot>,
    caps: StateCaps,
    /// Dirty pages the log reported, summed over harvests.
    dirty_pages: AtomicU64,
    ram: Arc<KvmRam>,
}

impl KvmVm {
    /// Creates a VM over `ram` (memslots `first_slot..`, in guest-physical
    /// order) with `vcpus` vCPUs and the dirty log `log`, and returns it
    /// with the vCPUs (their CPUID set; registers are the caller's). The
    /// vCPUs are not handed out bare: a vCPU that ran after the VM and its
    /// memory were gone would write to host memory reused since.
    ///
    /// # Errors
    /// KVM's refusals, by ioctl; [`Error::CapabilityMissing`] where the
    /// host lacks manual protect or the ring; [`Error::InvalidArgument`]
    /// for a ring size out of range or no vCPU.
    pub fn create(
        kvm: &Kvm,
        ram: Arc<KvmRam>,
        vcpus: u32,
        log: KvmDirtyLog,
        first_slot: u32,
    ) -> Result<(Arc<KvmVm>, NewVcpus), Error> {
        if vcpus == 0 || vcpus as usize > super::cpu_state::MAX_STATE_VCPUS {
            return Err(Error::invalid(
                "vcpus",
                format!("{vcpus} is not in 1..=128"),
            ));
        }
        let vm = kvm
            .create_vm()
            .map_err(|e| Error::from_errno("KVM_CREATE_VM", e))?;
        vm.create_irq_chip()
            .map_err(|e| Error::from_errno("KVM_CREATE_IRQCHIP", e))?;
        match log {
            KvmDirtyLog::Bitmap => {
                sys::enable_manual_protect(&vm, false)?;
            }
            KvmDirtyLog::Ring { entries } => dirty_ring::enable(&vm, entries)?,
        }
        let slots = ram.regions().slots().to_vec();
        let mut this = KvmVm {
            resetter: match log {
                KvmDirtyLog::Ring { .. } => Some(RingResetter::new(&vm)?),
                KvmDirtyLog::Bitmap => None,
            },
            vm,
            rings: Mutex::new(Vec::new()),
            ring_full: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            log,
            first_slot,
            slots,
            caps: StateCaps::none(),
            dirty_pages: AtomicU64::new(0),
            ram,
        };
        this.set_logging(false)?;
        let cpuid: CpuId = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| Error::from_errno("KVM_GET_SUPPORTED_CPUID", e))?;
        let mut fds = Vec::new();
        for i in 0..vcpus {
            let fd = this
                .vm
                .create_vcpu(u64::from(i))
                .map_err(|e| Error::from_errno("KVM_CREATE_VCPU", e))?;
            fd.set_cpuid2(&cpuid)
                .map_err(|e| Error::from_errno("KVM_SET_CPUID2", e))?;
            if let KvmDirtyLog::Ring { entries } = log {
                this.lock_rings().push(DirtyRing::map(&fd, entries)?);
            }
            fds.push(fd);
        }
        this.caps = StateCaps::probe(kvm, &this.vm, &fds[0])?;
        let vm = Arc::new(this);
        Ok((vm.clone(), NewVcpus { fds, vm }))
    }

    /// The dirty log it keeps.
    pub fn dirty_log(&self) -> KvmDirtyLog {
        self.log
    }

    /// Per vCPU: KVM stopped it because its ring was full (the vCPU
    /// runner sets it, a reset clears it).
    pub fn ring_full_flags(&self) -> Arc<[AtomicBool]> {
        self.ring_full.clone()
    }

    /// The VM fd.
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }

    /// What a vCPU's state carries on this host.
    pub fn state_caps(&self) -> &StateCaps {
        &self.caps
    }

    /// Dirty pages the log reported so far, summed over harvests (a page
    /// dirty in two harvests counts twice).
    pub fn dirty_pages(&self) -> u64 {
        self.dirty_pages.load(Ordering::Relaxed)
    }

    /// The KVM clock (`KVM_GET_CLOCK`; the TSC frequency is the vCPUs').
    ///
    /// # Errors
    /// KVM's refusal.
    pub fn clock_ns(&self) -> Result<u64, Error> {
        let c = self
            .vm
            .get_clock()
            .map_err(|e| Error::from_errno("KVM_GET_CLOCK", e))?;
        Ok(c.clock)
    }

    /// Sets the KVM clock to `clock.clock_ns` (`KVM_SET_CLOCK`), before
    /// any vCPU runs.
    ///
    /// # Errors
    /// KVM's refusal.
    pub fn set_clock(&self, clock: &ClockState) -> Result<(), Error> {
        let data = kvm_clock_data {
            clock: clock.clock_ns,
            ..Default::default()
        };
        self.vm
            .set_clock(&data)
            .map_err(|e| Error::from_errno("KVM_SET_CLOCK", e))
    }

    fn lock_rings(&self) -> std::sync::MutexGuard<'_, Vec<DirtyRing>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers every slot with dirty logging on or off.
    fn set_logging(&self, on: bool) -> Result<(), Error> {
        let flags = if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 };
        for (s, r) in self.slots.iter().zip(self.ram.regions().regions()) {
            let region = kvm_userspace_memory_region {
                slot: self.first_slot + u32::from(s.id),
                flags,
                guest_phys_addr: s.gpa,
                memory_size: s.size,
                userspace_addr: r.host_addr,
            };
            // SAFETY: the host range is one of `self.ram`'s mappings, which
            // `self` holds (an Arc) for as long as the VM fd lives (it is
            // dropped first).
            unsafe { self.vm.set_user_memory_region(region) }
                .map_err(|e| Error::from_errno("KVM_SET_USER_MEMORY_REGION", e))?;
        }
        Ok(())
    }

    fn slot(&self, id: u16) -> Result<&RamSlot, VmError> {
        self.slots
            .get(usize::from(id))
            .ok_or_else(|| VmError::new(format!("no memslot {id}")))
    }
}

fn vm_err(e: Error) -> VmError {
    VmError::new(e.to_string())
}

impl SessionVm for KvmVm {
    type Ram = KvmRam;

    fn ram(&self) -> &Arc<KvmRam> {
        &self.ram
    }

    fn slots(&self) -> &[RamSlot] {
        &self.slots
    }

    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        self.set_logging(true).map_err(vm_err)
    }

    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        self.set_logging(false).map_err(vm_err)?;
        if self.resetter.is_some() {
            // A vCPU stopped on a full ring runs again only after a reset.
            let mut dropped = Vec::new();
            self.harvest_rings(&mut dropped)?;
            self.reset_rings()?;
        }
        Ok(())
    }

    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        let s = self.slot(slot)?;
        let pages = s.size / 4096;
        let mut got = vec![0u64; sys::bitmap_words(pages)];
        sys::get_dirty_log(&self.vm, self.first_slot + u32::from(slot), pages, &mut got)
            .map_err(vm_err)?;
        if bitmap.len() < got.len() {
            return Err(VmError::new(format!(
                "{} words for a {pages}-page slot",
                bitmap.len()
            )));
        }
        let n: u32 = got.iter().map(|w| w.count_ones()).sum();
        self.dirty_pages.fetch_add(u64::from(n), Ordering::Relaxed);
        for (b, g) in bitmap.iter_mut().zip(&got) {
            *b |= g;
        }
        Ok(())
    }

    fn clear_dirty_log(&self, slot: u16, first: u64, n: u64, mask: &[u64]) -> Result<(), VmError> {
        let s = self.slot(slot)?;
        let n = n.min((s.size / 4096).saturating_sub(first));
        sys::clear_dirty_log(&self.vm, self.first_slot + u32::from(slot), first, n, mask)
            .map_err(vm_err)
    }

    fn harvest_rings(&self, out: &mut Vec<RingEntry>) -> Result<(), VmError> {
        if self.resetter.is_none() {
            return Err(VmError::new(
                "this VM logs dirty pages in bitmaps, not rings",
            ));
        }
        let (first, n) = (self.first_slot, self.slots.len() as u32);
        let before = out.len();
        for ring in self.lock_rings().iter_mut() {
            ring.harvest(|slot, offset| {
                // Address space 0 only; other slots are not guest RAM.
                if let Some(id) = slot.checked_sub(first).filter(|id| *id < n) {
                    out.push(RingEntry { slot: id, offset });
                }
            });
        }
        let n = (out.len() - before) as u64;
        self.dirty_pages.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    fn reset_rings(&self) -> Result<(), VmError> {
        let r = self
            .resetter
            .as_ref()
            .ok_or_else(|| VmError::new("no dirty rings"))?;
        r.reset().map_err(vm_err)?;
        self.ring_full
            .iter()
            .for_each(|f| f.store(false, Ordering::Release));
        Ok(())
    }

    fn ring_soft_full(&self, vcpu: usize) -> bool {
        self.ring_full
            .get(vcpu)
            .is_some_and(|f| f.load(Ordering::Acquire))
    }
}
