//! A minimal VM for the memstress workload: a system slot (GDT, code, control block,
//! guest page tables), test slots backed by [`GuestMemory`], and vCPUs that start in
//! 64-bit user mode running [`crate::guest_code::memstress_program`].
//!
//! Guest-physical (and, identity-mapped, guest-virtual) layout:
//!
//! | address | what |
//! |---|---|
//! | `0x1000` | GDT |
//! | `0x2000` | control block (word 0: write threshold) |
//! | `0x3000` | guest code |
//! | `0x4000..0x8000` | stack (unused by the program; rsp points at its top) |
//! | `0x10000..` | guest page tables |
//! | [`MMIO_DOORBELL_GPA`] | doorbell page: mapped in the guest, no memslot |
//! | [`TEST_GPA`] | test region, split into `slots` memslots (ids 1..=slots) |

use crate::cpu_mode;
use crate::dirty_ring::{self, DirtyRing};
use crate::error::Error;
use crate::guest_code::{self, GUEST_PAGE_SIZE};
use crate::kvm_handle::open_kvm;
use crate::memory::{Backing, GuestMemory};
use crate::page_tables::GuestPageTables;
use kvm_bindings::{
    kvm_userspace_memory_region, CpuId, KVM_EXIT_DIRTY_RING_FULL, KVM_MAX_CPUID_ENTRIES,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};

/// GDT location.
pub const GDT_GPA: u64 = 0x1000;
/// Control block location.
pub const CONTROL_GPA: u64 = 0x2000;
/// Guest code location.
pub const CODE_GPA: u64 = 0x3000;
/// Top of the guest stack.
pub const STACK_TOP_GPA: u64 = 0x8000;
/// First guest page-table page (the PML4).
pub const PAGE_TABLES_GPA: u64 = 0x10000;
/// The doorbell: a guest-physical page no memslot covers, so a write to it exits to the
/// host with `KVM_EXIT_MMIO`.
pub const MMIO_DOORBELL_GPA: u64 = 0xd000_0000;
/// Where the test region starts (4 GiB; 1 GiB-aligned for any backing).
pub const TEST_GPA: u64 = 1 << 32;
/// Memslot id of the system slot.
pub const SYSTEM_SLOT: u32 = 0;

/// One test memslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestSlot {
    /// Memslot id (1..=slots).
    pub id: u32,
    /// First guest-physical address.
    pub gpa: u64,
    /// Number of 4 KiB pages.
    pub pages: u64,
    /// Host virtual address of its first byte.
    pub host_addr: u64,
}

/// Shape of a memstress VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemstressShape {
    /// Number of vCPUs (each gets its own region).
    pub vcpus: u32,
    /// Bytes each vCPU accesses.
    pub bytes_per_vcpu: u64,
    /// Number of test memslots the whole region is split into.
    pub slots: u32,
    /// Host memory behind the test region.
    pub backing: Backing,
    /// Per-vCPU dirty ring entries, when the VM uses the dirty ring instead of bitmaps.
    pub dirty_ring_entries: Option<u32>,
}

impl MemstressShape {
    /// Pages each vCPU touches per pass.
    pub fn pages_per_vcpu(&self) -> u64 {
        self.bytes_per_vcpu / GUEST_PAGE_SIZE
    }
    /// Pages in the whole test region.
    pub fn total_pages(&self) -> u64 {
        self.pages_per_vcpu() * u64::from(self.vcpus)
    }
    /// Pages in each test slot.
    pub fn pages_per_slot(&self) -> u64 {
        self.total_pages() / u64::from(self.slots.max(1))
    }

    /// Checks the shape the way memstress does, plus the limits of this layout.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the offending field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.vcpus == 0 || self.vcpus > 512 {
            return Err(Error::invalid(
                "vcpus",
                format!("{} is not in 1..=512", self.vcpus),
            ));
        }
        if self.bytes_per_vcpu == 0 || !self.bytes_per_vcpu.is_multiple_of(GUEST_PAGE_SIZE) {
            return Err(Error::invalid(
                "bytes_per_vcpu",
                format!("{} is not a positive multiple of 4096", self.bytes_per_vcpu),
            ));
        }
        let total = self
            .bytes_per_vcpu
            .checked_mul(u64::from(self.vcpus))
            .filter(|t| *t <= 1 << 40)
            .ok_or_else(|| Error::invalid("bytes_per_vcpu", "total test memory exceeds 1 TiB"))?;
        if self.slots == 0 || !self.total_pages().is_multiple_of(u64::from(self.slots)) {
            return Err(Error::invalid(
                "slots",
                format!(
                    "{} guest pages cannot be evenly divided into {} slots",
                    self.total_pages(),
                    self.slots
                ),
            ));
        }
        let slot_bytes = total / u64::from(self.slots);
        if !slot_bytes.is_multiple_of(self.backing.page_size()) {
            return Err(Error::invalid(
                "slots",
                format!(
                    "each slot would be {slot_bytes} bytes, not a multiple of the {} page size",
                    self.backing
                ),
            ));
        }
        if let Some(entries) = self.dirty_ring_entries {
            dirty_ring::validate_entries(entries)?;
        }
        if self.slots > 32000 {
            return Err(Error::invalid(
                "slots",
                format!("{} exceeds 32000", self.slots),
            ));
        }
        Ok(())
    }
}

/// Refuses a shape with more vCPUs or slots than this KVM offers (slot 0 is the system's).
fn check_kvm_limits(kvm: &Kvm, shape: &MemstressShape) -> Result<(), Error> {
    let max_vcpus = kvm.get_max_vcpus();
    if shape.vcpus as usize > max_vcpus {
        return Err(Error::invalid(
            "vcpus",
            format!("{} exceeds KVM_CAP_MAX_VCPUS {max_vcpus}", shape.vcpus),
        ));
    }
    let max_slots = kvm.get_nr_memslots() as u64;
    if u64::from(shape.slots) + 1 > max_slots {
        return Err(Error::TooManySlots {
            requested: u64::from(shape.slots),
            max: max_slots,
        });
    }
    Ok(())
}

/// The system slot's memory: GDT, the guest program, its control block and the guest
/// page tables, loaded.
fn system_memory(tables: &GuestPageTables) -> Result<GuestMemory, Error> {
    let system_len = (PAGE_TABLES_GPA + tables.size_bytes()).next_multiple_of(2 << 20);
    if system_len > MMIO_DOORBELL_GPA {
        return Err(Error::invalid(
            "bytes_per_vcpu",
            "guest page tables do not fit",
        ));
    }
    let system = GuestMemory::new(system_len, Backing::Anonymous)?;
    system.write_bytes(GDT_GPA, &cpu_mode::gdt_bytes())?;
    system.write_bytes(CODE_GPA, &guest_code::memstress_program())?;
    let all_writes = guest_code::THRESHOLD_ALL_WRITES.to_le_bytes();
    system.write_bytes(CONTROL_GPA, &all_writes)?;
    system.write_bytes(PAGE_TABLES_GPA, &tables.bytes())?;
    Ok(system)
}

/// The memstress VM: owns the VM fd, its memory and (until handed out) its vCPUs.
#[derive(Debug)]
pub struct MemstressVm {
    // Field order matters for drop: the VM (and its slots) goes before the memory.
    vm: VmFd,
    vcpus: Vec<VcpuFd>,
    rings: Vec<DirtyRing>,
    shape: MemstressShape,
    slots: Vec<TestSlot>,
    system: GuestMemory,
    test: GuestMemory,
}

impl MemstressVm {
    /// Creates the VM, its memory slots and its vCPUs, ready to run pass 0.
    ///
    /// # Errors
    /// Any [`Error`]: invalid shape, KVM unusable, hugetlb pages missing, ioctl failures.
    pub fn create(kvm: &Kvm, shape: MemstressShape) -> Result<Self, Error> {
        shape.validate()?;
        check_kvm_limits(kvm, &shape)?;
        let total = shape.bytes_per_vcpu * u64::from(shape.vcpus);
        let mut tables = GuestPageTables::new(PAGE_TABLES_GPA)?;
        tables.map(0, 0, PAGE_TABLES_GPA)?;
        tables.map(MMIO_DOORBELL_GPA, MMIO_DOORBELL_GPA, GUEST_PAGE_SIZE)?;
        tables.map(TEST_GPA, TEST_GPA, total)?;
        let system = system_memory(&tables)?;
        let test = GuestMemory::new(total, shape.backing)?;

        let vm = kvm
            .create_vm()
            .map_err(|e| Error::from_errno("KVM_CREATE_VM", e))?;
        let pages_per_slot = shape.pages_per_slot();
        let slots: Vec<TestSlot> = (0..shape.slots)
            .map(|i| TestSlot {
                id: i + 1,
                gpa: TEST_GPA + u64::from(i) * pages_per_slot * GUEST_PAGE_SIZE,
                pages: pages_per_slot,
                host_addr: test.host_addr() + u64::from(i) * pages_per_slot * GUEST_PAGE_SIZE,
            })
            .collect();
        let mut this = MemstressVm {
            vm,
            vcpus: Vec::new(),
            rings: Vec::new(),
            shape,
            slots,
            system,
            test,
        };
        let system_region = kvm_userspace_memory_region {
            slot: SYSTEM_SLOT,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: this.system.size(),
            userspace_addr: this.system.host_addr(),
        };
        // SAFETY: the region is `this.system`, which `this` owns and drops after the VM fd.
        unsafe { this.vm.set_user_memory_region(system_region) }
            .map_err(|e| Error::from_errno("KVM_SET_USER_MEMORY_REGION", e))?;
        for i in 0..this.slots.len() {
            this.set_slot_flags(i, 0)?;
        }

        if let Some(entries) = shape.dirty_ring_entries {
            // The ring size is fixed before any vCPU exists (KVM refuses it afterwards).
            dirty_ring::enable(&this.vm, entries)?;
        }
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| Error::from_errno("KVM_GET_SUPPORTED_CPUID", e))?;
        for index in 0..shape.vcpus {
            let vcpu = this.create_vcpu(&cpuid, index, tables.root_gpa())?;
            if let Some(entries) = shape.dirty_ring_entries {
                this.rings.push(DirtyRing::map(&vcpu, entries)?);
            }
            this.vcpus.push(vcpu);
        }
        Ok(this)
    }

    /// Creates vCPU `index` in user long mode at the memstress program, with its share of
    /// the test memory, the doorbell and the control block in its registers.
    fn create_vcpu(&self, cpuid: &CpuId, index: u32, root_gpa: u64) -> Result<VcpuFd, Error> {
        let shape = &self.shape;
        let vcpu = self
            .vm
            .create_vcpu(u64::from(index))
            .map_err(|e| Error::from_errno("KVM_CREATE_VCPU", e))?;
        // KVM refuses EFER.LME unless the guest's CPUID reports long mode.
        vcpu.set_cpuid2(cpuid)
            .map_err(|e| Error::from_errno("KVM_SET_CPUID2", e))?;
        let mut sregs = vcpu
            .get_sregs()
            .map_err(|e| Error::from_errno("KVM_GET_SREGS", e))?;
        cpu_mode::set_user_long_mode(&mut sregs, GDT_GPA, root_gpa);
        vcpu.set_sregs(&sregs)
            .map_err(|e| Error::from_errno("KVM_SET_SREGS", e))?;
        let mut regs = vcpu
            .get_regs()
            .map_err(|e| Error::from_errno("KVM_GET_REGS", e))?;
        regs.rip = CODE_GPA;
        regs.rsp = STACK_TOP_GPA;
        regs.rflags = 2;
        regs.rdi = TEST_GPA + u64::from(index) * shape.bytes_per_vcpu;
        regs.rsi = shape.pages_per_vcpu();
        regs.r8 = MMIO_DOORBELL_GPA;
        regs.r9 = CONTROL_GPA;
        regs.r10 = guest_code::initial_random_state(index);
        regs.rax = guest_code::MEMSTRESS_VALUE;
        vcpu.set_regs(&regs)
            .map_err(|e| Error::from_errno("KVM_SET_REGS", e))?;
        Ok(vcpu)
    }

    /// Opens KVM and runs one 64 KiB pass on one vCPU: succeeds only where this machine can
    /// run the crate's CPL-3 guests.
    ///
    /// # Errors
    /// The [`Error`] that stopped it.
    pub fn probe() -> Result<(), Error> {
        let kvm = open_kvm()?;
        let mut vm = MemstressVm::create(
            &kvm,
            MemstressShape {
                vcpus: 1,
                bytes_per_vcpu: 64 << 10,
                slots: 1,
                backing: Backing::Anonymous,
                dirty_ring_entries: None,
            },
        )?;
        let mut vcpus = vm.take_vcpus();
        let mut exits = PassExits::default();
        run_pass(&mut vcpus[0], 0, &mut exits, &mut || Ok(()))?;
        // The guest wrote every page: check one word really landed in the test memory.
        if vm.test.read_u64(0) != Some(guest_code::MEMSTRESS_VALUE) {
            return Err(Error::GuestFailed {
                vcpu: 0,
                exit_reason: "pass finished but the test memory was not written".into(),
            });
        }
        drop(vcpus);
        drop(vm);
        Ok(())
    }

    /// The VM fd.
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }

    /// The shape it was built with.
    pub fn shape(&self) -> MemstressShape {
        self.shape
    }

    /// The test slots, in id order.
    pub fn slots(&self) -> &[TestSlot] {
        &self.slots
    }

    /// The test memory (for checks of what the guest wrote).
    pub fn test_memory(&self) -> &GuestMemory {
        &self.test
    }

    /// Moves the vCPUs out, to hand one to each vCPU thread.
    pub fn take_vcpus(&mut self) -> Vec<VcpuFd> {
        std::mem::take(&mut self.vcpus)
    }

    /// Moves the dirty rings out (one per vCPU, in vCPU order; empty without a ring).
    pub fn take_rings(&mut self) -> Vec<DirtyRing> {
        std::mem::take(&mut self.rings)
    }

    /// Sets the per-pass write threshold the guest reads at the start of each pass.
    ///
    /// # Errors
    /// Never in practice (the control block is inside the system slot).
    pub fn set_write_threshold(&self, threshold: u64) -> Result<(), Error> {
        Ok(self
            .system
            .write_bytes(CONTROL_GPA, &threshold.to_le_bytes())?)
    }

    /// Re-registers test slot `index` with `flags` (a FLAGS_ONLY update when only
    /// `KVM_MEM_LOG_DIRTY_PAGES` changes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad index; [`Error::Ioctl`] when KVM refuses.
    pub fn set_slot_flags(&self, index: usize, flags: u32) -> Result<(), Error> {
        let slot = self
            .slots
            .get(index)
            .ok_or_else(|| Error::invalid("slot", format!("no test slot #{index}")))?;
        let region = kvm_userspace_memory_region {
            slot: slot.id,
            flags,
            guest_phys_addr: slot.gpa,
            memory_size: slot.pages * GUEST_PAGE_SIZE,
            userspace_addr: slot.host_addr,
        };
        // SAFETY: the host range lies inside `self.test`, which lives as long as the VM.
        unsafe { self.vm.set_user_memory_region(region) }
            .map_err(|e| Error::from_errno("KVM_SET_USER_MEMORY_REGION", e))
    }

    /// Turns dirty logging on or off for every test slot.
    ///
    /// # Errors
    /// [`Error::Ioctl`] when KVM refuses.
    pub fn set_dirty_logging(&self, on: bool) -> Result<(), Error> {
        let flags = if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 };
        for i in 0..self.slots.len() {
            self.set_slot_flags(i, flags)?;
        }
        Ok(())
    }
}

/// What one pass cost in returns from `KVM_RUN` to this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassExits {
    /// `KVM_EXIT_MMIO` returns (the doorbell).
    pub mmio: u64,
    /// `KVM_EXIT_DIRTY_RING_FULL` returns (the ring was harvested and reset, then the
    /// pass went on).
    pub ring_full: u64,
    /// Other returns (signals, `KVM_EXIT_INTR`), each retried.
    pub other: u64,
}

/// Runs `vcpu` until it rings the doorbell once (one memstress pass), counting the
/// returns to userspace in `exits`. `on_ring_full` must harvest and reset the dirty ring
/// when KVM stops the vCPU because its ring is full.
///
/// # Errors
/// [`Error::GuestFailed`] for any exit other than the doorbell, a full ring or an
/// interruption; [`Error::Ioctl`] when `KVM_RUN` fails; whatever `on_ring_full` returns.
pub fn run_pass(
    vcpu: &mut VcpuFd,
    index: u32,
    exits: &mut PassExits,
    on_ring_full: &mut dyn FnMut() -> Result<(), Error>,
) -> Result<(), Error> {
    loop {
        match vcpu.run() {
            Ok(VcpuExit::Unsupported(reason)) if reason == KVM_EXIT_DIRTY_RING_FULL => {
                exits.ring_full += 1;
                on_ring_full()?;
            }
            Ok(VcpuExit::MmioWrite(addr, _)) if addr == MMIO_DOORBELL_GPA => {
                exits.mmio += 1;
                return Ok(());
            }
            Ok(VcpuExit::Intr) => exits.other += 1,
            Ok(other) => {
                let exit_reason = format!("{other:?}");
                let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                return Err(Error::GuestFailed {
                    vcpu: index,
                    exit_reason: format!("{exit_reason} at rip {rip:#x}"),
                });
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => exits.other += 1,
            Err(e) => return Err(Error::from_errno("KVM_RUN", e)),
        }
    }
}

/// `None` when this process can create a VM and run a CPL-3 guest on it; otherwise a
/// one-line reason, for tests to print as `skipped: <reason>`.
pub fn kvm_unusable_reason() -> Option<String> {
    match MemstressVm::probe() {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MemstressShape {
        MemstressShape {
            vcpus: 1,
            bytes_per_vcpu: 1 << 20,
            slots: 1,
            backing: Backing::Anonymous,
            dirty_ring_entries: None,
        }
    }

    #[test]
    fn shape_validation() {
        assert!(small().validate().is_ok());
        assert!(MemstressShape {
            dirty_ring_entries: Some(100),
            ..small()
        }
        .validate()
        .is_err());
        assert!(MemstressShape {
            backing: Backing::AnonymousThp,
            slots: 2,
            ..small()
        }
        .validate()
        .is_err());
        assert!(MemstressShape {
            bytes_per_vcpu: 1 << 40,
            vcpus: 2,
            ..small()
        }
        .validate()
        .is_err());
    }

    #[test]
    #[cfg_attr(
        not(s2mmu_kvm_device),
        ignore = "needs /dev/kvm, read-write (see the build warning)"
    )]
    fn a_faulting_guest_is_reported_not_hung() {
        if let Some(reason) = crate::kvm_unusable_reason() {
            panic!("the build opened /dev/kvm but KVM cannot run this crate's guests: {reason}");
        }
        let kvm = open_kvm().unwrap();
        let mut vm = MemstressVm::create(&kvm, small()).unwrap();
        // `hlt` at CPL 3 raises #GP; with no IDT that is a triple fault (shutdown).
        vm.system.write_bytes(CODE_GPA, &[0xf4]).unwrap();
        let mut vcpus = vm.take_vcpus();
        let err =
            run_pass(&mut vcpus[0], 0, &mut PassExits::default(), &mut || Ok(())).unwrap_err();
        assert!(matches!(err, Error::GuestFailed { vcpu: 0, .. }), "{err}");
    }
}
