//! A tiny guest to migrate: vCPUs at CPL 3 in 64-bit mode writing a
//! counter into every page of two RAM regions (below and above a hole)
//! without end, ringing the doorbell after each pass. Its RAM is three
//! regions: the system region (GDT, code, stack, page tables), 6 MiB at
//! 2 MiB and 8 MiB at 4 GiB, which the guest sees as one virtual range;
//! with `n` vCPUs, vCPU `i` writes every `n`-th page from page `i`. Each
//! page's first word holds the counter's value when it was last written,
//! so a write the dirty log lost shows up as a page that differs.
//!
//! The guest depends on state beyond its general registers, and checks
//! it: it keeps a copy of its counter in `xmm0` and compares the two
//! before every store (a lost XSAVE area fails it), and it reads the TSC
//! after every pass and compares it with the last (a TSC that went back
//! fails it). A failed check stores to [`SSE_FAULT_GPA`] or
//! [`TSC_FAULT_GPA`], which stops the vCPU with the reason. The VMM's side
//! sets values the guest does not read and the test reads back through
//! KVM after the move: `IA32_KERNEL_GS_BASE`, the APIC's task priority,
//! DR0 ([`vmm_marks`]).
//!
//! A guest may write fewer pages per pass than its share (its working
//! set); every data page holds its index, written by the host before the
//! guest runs, until the guest writes it.
//!
//! Registers: `rdi` the first page, `rsi` pages per pass, `r11` the
//! stride, `r8` the doorbell, `rax` the counter (incremented before every
//! store), `r9` the last TSC.

use super::cpu_state::{KvmState, VcpuState};
use super::ram::KvmRam;
use super::session_vm::{KvmDirtyLog, KvmVm, NewVcpus};
use super::vcpu_io;
use super::vcpus::{ExitHandler, KvmVcpus};
use crate::asm::{Assembler, Cond, Reg};
use crate::cpu_mode::{self, CR4_OSFXSR, CR4_OSXMMEXCPT};
use crate::memory::Backing;
use crate::page_tables::GuestPageTables;
use crate::vm::{CODE_GPA, GDT_GPA, MMIO_DOORBELL_GPA, PAGE_TABLES_GPA, STACK_TOP_GPA};
use crate::Error;
use kvm_bindings::KVM_MP_STATE_RUNNABLE;
use kvm_ioctls::{Kvm, VcpuExit};
use s2mmu::format::ept::EptStage2;
use s2mmu::format::FormatId;
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, SessionVm};
use std::sync::{Arc, Mutex};

/// Bytes of the system region at guest-physical 0.
pub const SYSTEM_SIZE: u64 = 2 << 20;
/// The region below the hole.
pub const LOW: (u64, u64) = (2 << 20, 6 << 20);
/// The region above it (at 4 GiB).
pub const HIGH: (u64, u64) = (1 << 32, 8 << 20);
/// The guest-virtual base of the range the guest writes.
pub const DATA_GVA: u64 = 0x4000_0000;
/// Pages the guest writes per pass (all vCPUs together).
pub const DATA_PAGES: u64 = (LOW.1 + HIGH.1) / 4096;
/// KVM memslot of the first region.
pub const FIRST_SLOT: u32 = 0;
/// The most vCPUs of this guest (each writes a share of the pages).
pub const MAX_WRITER_VCPUS: u32 = 8;
/// Where a vCPU stores when `xmm0` lost its copy of the counter.
pub const SSE_FAULT_GPA: u64 = MMIO_DOORBELL_GPA + 8;
/// Where a vCPU stores when the TSC went back.
pub const TSC_FAULT_GPA: u64 = MMIO_DOORBELL_GPA + 16;
/// `IA32_KERNEL_GS_BASE`.
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// The local APIC's task priority register (byte offset).
pub const APIC_TPR: usize = 0x80;

/// The values the VMM's side sets on vCPU `i` before it runs (the guest
/// neither reads nor changes them): `IA32_KERNEL_GS_BASE`, the APIC's
/// task priority, DR0.
pub fn vmm_marks(i: usize) -> (u64, u8, u64) {
    let i = i as u64;
    (
        0x5eed_0000_0000 + i,
        0x20 + 0x10 * (i as u8 & 7),
        0xd0_0000 + i * 8,
    )
}

/// The marks as KVM holds them in `v` (`None` where one is missing).
pub fn marks_of(v: &VcpuState) -> Option<(u64, u8, u64)> {
    let gs = v.msrs.iter().find(|(i, _)| *i == MSR_KERNEL_GS_BASE)?.1;
    let tpr = v.lapic.as_ref()?.regs[APIC_TPR] as u8;
    Some((gs, tpr, v.debugregs.as_ref()?.db[0]))
}

/// The guest's RAM layout: (gpa, size) per region.
pub fn layout() -> [(u64, u64); 3] {
    [(0, SYSTEM_SIZE), LOW, HIGH]
}

/// The guest program (see the module's text).
pub fn writer_program() -> Vec<u8> {
    let mut a = Assembler::new();
    let (pass, page) = (a.label(), a.label());
    let (sse_fault, tsc_fault) = (a.label(), a.label());
    a.bind(pass);
    a.mov_rr(Reg::Rcx, Reg::Rdi);
    a.mov_rr(Reg::Rdx, Reg::Rsi);
    a.bind(page);
    a.movq_from_xmm(Reg::Rbx, 0);
    a.cmp_rr(Reg::Rbx, Reg::Rax);
    a.jcc(Cond::NotEqual, sse_fault);
    a.add_ri(Reg::Rax, 1);
    a.movq_to_xmm(0, Reg::Rax);
    a.store(Reg::Rcx, 0, Reg::Rax);
    a.add_rr(Reg::Rcx, Reg::R11);
    a.dec(Reg::Rdx);
    a.jcc(Cond::NotEqual, page);
    a.mov_rr(Reg::R10, Reg::Rax);
    a.rdtsc();
    a.shl_ri(Reg::Rdx, 32);
    a.or_rr(Reg::Rax, Reg::Rdx);
    a.cmp_rr(Reg::Rax, Reg::R9);
    a.jcc(Cond::Below, tsc_fault);
    a.mov_rr(Reg::R9, Reg::Rax);
    a.mov_rr(Reg::Rax, Reg::R10);
    a.store(Reg::R8, 0, Reg::Rax); // the doorbell: KVM_EXIT_MMIO
    a.jmp(pass);
    a.bind(sse_fault);
    a.store(
        Reg::R8,
        (SSE_FAULT_GPA - MMIO_DOORBELL_GPA) as i32,
        Reg::Rax,
    );
    a.jmp(sse_fault);
    a.bind(tsc_fault);
    a.store(
        Reg::R8,
        (TSC_FAULT_GPA - MMIO_DOORBELL_GPA) as i32,
        Reg::Rax,
    );
    a.jmp(tsc_fault);
    a.finish().unwrap_or_default() // every label is bound
}

/// Counts a pass per doorbell; a failed check or any other exit stops
/// the vCPU with the reason.
pub(super) fn exits() -> Arc<ExitHandler> {
    Arc::new(|_, exit: &VcpuExit<'_>| match exit {
        VcpuExit::MmioWrite(addr, _) if *addr == MMIO_DOORBELL_GPA => Ok(1),
        VcpuExit::MmioWrite(addr, _) if *addr == SSE_FAULT_GPA => {
            Err("state check: xmm0 lost the counter (the XSAVE area was not restored)".into())
        }
        VcpuExit::MmioWrite(addr, _) if *addr == TSC_FAULT_GPA => {
            Err("state check: the TSC went back".into())
        }
        other => Err(format!("unexpected exit {other:?}")),
    })
}

/// The guest on either end: its VM and its running vCPUs.
pub struct WriterGuest {
    pub(super) vm: Arc<KvmVm>,
    pub(super) vcpus: KvmVcpus,
    /// The state the last STATE carried.
    pub(super) sent: Mutex<Option<KvmState>>,
    /// Where a destination reports why its FINAL state failed.
    pub(super) report: Option<Arc<dyn Fn(String) + Send + Sync>>,
}

pub(super) fn fresh_vm(
    kvm: &Kvm,
    log: KvmDirtyLog,
    vcpus: u32,
) -> Result<(Arc<KvmVm>, NewVcpus), Error> {
    if vcpus == 0 || vcpus > MAX_WRITER_VCPUS || !DATA_PAGES.is_multiple_of(u64::from(vcpus)) {
        let why = format!("{vcpus}: 1..={MAX_WRITER_VCPUS}, dividing {DATA_PAGES} pages");
        return Err(Error::invalid("vcpus", why));
    }
    let ram = Arc::new(KvmRam::new(&layout(), Backing::Anonymous)?);
    KvmVm::create(kvm, ram, vcpus, log, FIRST_SLOT)
}

/// vCPU `i` of `n` as it starts: its registers, SSE on, the VMM's marks.
fn initial_vcpu(fds: &NewVcpus, i: usize, root: u64, pages: u64) -> Result<VcpuState, Error> {
    let fd = &fds.fds()[i];
    let n = fds.fds().len() as u64;
    let mut sregs = fd
        .get_sregs()
        .map_err(|e| Error::from_errno("KVM_GET_SREGS", e))?;
    cpu_mode::set_user_long_mode(&mut sregs, GDT_GPA, root);
    sregs.cr4 |= CR4_OSFXSR | CR4_OSXMMEXCPT;
    let mut regs = fd
        .get_regs()
        .map_err(|e| Error::from_errno("KVM_GET_REGS", e))?;
    (regs.rip, regs.rsp, regs.rflags) = (CODE_GPA, STACK_TOP_GPA - 256 * i as u64, 2);
    (regs.rdi, regs.rsi, regs.r11) = (DATA_GVA + 4096 * i as u64, pages, 4096 * n);
    (regs.r8, regs.rax, regs.r9) = (MMIO_DOORBELL_GPA, 0, 0);
    let (gs, tpr, dr0) = vmm_marks(i);
    let mut lapic = fd
        .get_lapic()
        .map_err(|e| Error::from_errno("KVM_GET_LAPIC", e))?;
    lapic.regs[APIC_TPR] = tpr as std::os::raw::c_char;
    let mut debugregs = fd
        .get_debug_regs()
        .map_err(|e| Error::from_errno("KVM_GET_DEBUGREGS", e))?;
    debugregs.db[0] = dr0;
    Ok(VcpuState {
        regs,
        sregs,
        msrs: vec![(MSR_KERNEL_GS_BASE, gs)],
        lapic: Some(lapic),
        debugregs: Some(debugregs),
        // With an in-kernel APIC only vCPU 0 starts runnable; the others
        // would wait for a startup IPI.
        mp_state: Some(KVM_MP_STATE_RUNNABLE),
        ..VcpuState::default()
    })
}

impl WriterGuest {
    /// A fresh guest of `vcpus` vCPUs, loaded and running from counter 0.
    ///
    /// # Errors
    /// KVM's, the layout's; [`Error::InvalidArgument`] for a vCPU count
    /// outside 1..=[`MAX_WRITER_VCPUS`] or not dividing [`DATA_PAGES`].
    pub fn start(kvm: &Kvm, log: KvmDirtyLog, vcpus: u32) -> Result<WriterGuest, Error> {
        let share = DATA_PAGES / u64::from(vcpus.max(1));
        Self::start_with_working_set(kvm, log, vcpus, share)
    }

    /// As [`WriterGuest::start`], each vCPU writing only the first
    /// `pages` of its share per pass.
    ///
    /// # Errors
    /// As [`WriterGuest::start`]; [`Error::InvalidArgument`] for `pages`
    /// outside 1..=its share.
    pub fn start_with_working_set(
        kvm: &Kvm,
        log: KvmDirtyLog,
        vcpus: u32,
        pages: u64,
    ) -> Result<WriterGuest, Error> {
        let (vm, fds) = fresh_vm(kvm, log, vcpus)?;
        let share = DATA_PAGES / u64::from(vcpus);
        if pages == 0 || pages > share {
            let why = format!("{pages} pages per pass: 1..={share}");
            return Err(Error::invalid("working set", why));
        }
        let mut tables = GuestPageTables::new(PAGE_TABLES_GPA)?;
        tables.map(0, 0, PAGE_TABLES_GPA)?;
        tables.map(MMIO_DOORBELL_GPA, MMIO_DOORBELL_GPA, 4096)?;
        tables.map(DATA_GVA, LOW.0, LOW.1)?;
        tables.map(DATA_GVA + LOW.1, HIGH.0, HIGH.1)?;
        if PAGE_TABLES_GPA + tables.size_bytes() > SYSTEM_SIZE {
            return Err(Error::invalid("layout", "the page tables do not fit"));
        }
        let ram = vm.ram();
        ram.write_gpa(GDT_GPA, &cpu_mode::gdt_bytes())?;
        ram.write_gpa(CODE_GPA, &writer_program())?;
        ram.write_gpa(PAGE_TABLES_GPA, &tables.bytes())?;
        for (gpa, size) in [LOW, HIGH] {
            for p in 0..size / 4096 {
                let index = (gpa + p * 4096) / 4096;
                ram.write_gpa(gpa + p * 4096, &index.to_le_bytes())?;
            }
        }
        let caps = vm.state_caps();
        for i in 0..vcpus as usize {
            let st = initial_vcpu(&fds, i, tables.root_gpa(), pages)?;
            vcpu_io::restore(&fds.fds()[i], &st, caps)?;
        }
        let vcpus = KvmVcpus::start(fds, None, exits(), false)?;
        Ok(WriterGuest {
            vm,
            vcpus,
            sent: Mutex::new(None),
            report: None,
        })
    }

    /// Its VM.
    pub fn kvm_vm(&self) -> &Arc<KvmVm> {
        &self.vm
    }

    /// Its vCPUs (the throttle, the progress).
    pub fn vcpus(&self) -> &KvmVcpus {
        &self.vcpus
    }

    /// Every vCPU's state and the clock (pauses the vCPUs).
    ///
    /// # Errors
    /// KVM's.
    pub fn registers(&self) -> Result<KvmState, Error> {
        self.vcpus.save()
    }

    /// The state the migration's STATE carried, once it was sent.
    pub fn sent_state(&self) -> Option<KvmState> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Why a vCPU stopped on its own, if one did.
    pub fn errors(&self) -> Vec<String> {
        self.vcpus.errors()
    }
}

impl GuestRun for WriterGuest {
    fn pause(&self) {
        self.vcpus.pause();
    }
    fn request_pause(&self) {
        self.vcpus.request_pause();
    }
    fn resume(&self) {
        self.vcpus.resume();
    }
    fn counters(&self) -> GuestCounters {
        self.vcpus.counters()
    }
    fn set_throttle_ns(&self, ns: u64) {
        self.vcpus.set_throttle_ns(ns);
    }
    fn pace(&self) -> u64 {
        self.vcpus.pace()
    }
    fn set_pace(&self, pages_per_sec: u64) {
        self.vcpus.set_pace(pages_per_sec);
    }
}

pub(super) fn state_err(e: impl std::fmt::Display) -> MigrateError {
    MigrateError::BadState { why: e.to_string() }
}

/// The header's format: KVM's x86 tables are EPT's.
pub fn wire_format() -> FormatId {
    FormatId::of::<EptStage2>()
}

impl SourceGuest for WriterGuest {
    type Vm = KvmVm;
    type Hook = NoHook;
    fn vm(&self) -> &Arc<KvmVm> {
        &self.vm
    }
    fn shape(&self) -> GuestShape {
        let (mem_size, slots) = (self.vm.ram().regions().size(), layout().len() as u32);
        let (backing, format) = ("anonymous".into(), wire_format());
        GuestShape {
            mem_size,
            slots,
            vcpus: self.vcpus.passes().len() as u32,
            backing,
            format,
        }
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        Arc::new(GuestCounters::default)
    }
    fn state(&self, _pace: u64) -> Result<Vec<u8>, MigrateError> {
        let st = self.vcpus.save().map_err(state_err)?;
        let body = st.encode().map_err(state_err)?;
        *self.sent.lock().unwrap_or_else(|p| p.into_inner()) = Some(st);
        Ok(body)
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
}
