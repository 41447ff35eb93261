//! A tiny guest to migrate: one vCPU at CPL 3 in 64-bit mode writing a
//! counter into every page of two RAM regions (below and above a hole)
//! without end, ringing the doorbell after each pass. Its RAM is three
//! regions: the system region (GDT, code, stack, page tables), 6 MiB at
//! 2 MiB and 8 MiB at 4 GiB, which the guest sees as one virtual range.
//! Each page's first word holds the counter's value when it was last
//! written, so a write the dirty log lost shows up as a page that
//! differs.
//!
//! Registers: `rdi` the range's virtual base, `rsi` its pages, `r8` the
//! doorbell, `rax` the counter (incremented before every store).

use super::cpu_state::{decode_vcpus, encode_vcpus, VcpuState};
use super::ram::KvmRam;
use super::session_vm::{KvmDirtyLog, KvmVm, NewVcpus};
use super::vcpus::{ExitHandler, KvmVcpus};
use crate::asm::{Assembler, Cond, Reg};
use crate::memory::Backing;
use crate::page_tables::GuestPageTables;
use crate::vm::{CODE_GPA, GDT_GPA, MMIO_DOORBELL_GPA, PAGE_TABLES_GPA, STACK_TOP_GPA};
use crate::{cpu_mode, Error};
use kvm_ioctls::{Kvm, VcpuExit};
use s2mmu::format::ept::EptFormat;
use s2mmu::format::FormatId;
use s2mmu_migrate::session::dest::{DestFactory, DestGuest, ResumedGuest};
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, SessionVm};
use s2mmu_migrate::wire::{Header, WireFormat};
use std::sync::{Arc, Mutex};

/// Bytes of the system region at guest-physical 0.
pub const SYSTEM_SIZE: u64 = 2 << 20;
/// The region below the hole.
pub const LOW: (u64, u64) = (2 << 20, 6 << 20);
/// The region above it (at 4 GiB).
pub const HIGH: (u64, u64) = (1 << 32, 8 << 20);
/// The guest-virtual base of the range the guest writes.
pub const DATA_GVA: u64 = 0x4000_0000;
/// Pages the guest writes per pass.
pub const DATA_PAGES: u64 = (LOW.1 + HIGH.1) / 4096;
/// KVM memslot of the first region.
pub const FIRST_SLOT: u32 = 0;

/// The guest's RAM layout: (gpa, size) per region.
pub fn layout() -> [(u64, u64); 3] {
    [(0, SYSTEM_SIZE), LOW, HIGH]
}

/// The guest program (see the module's text).
pub fn writer_program() -> Vec<u8> {
    let mut a = Assembler::new();
    let (pass, page) = (a.label(), a.label());
    a.bind(pass);
    a.mov_rr(Reg::Rcx, Reg::Rdi);
    a.mov_rr(Reg::Rdx, Reg::Rsi);
    a.bind(page);
    a.add_ri(Reg::Rax, 1);
    a.store(Reg::Rcx, 0, Reg::Rax);
    a.add_ri(Reg::Rcx, 4096);
    a.dec(Reg::Rdx);
    a.jcc(Cond::NotEqual, page);
    a.store(Reg::R8, 0, Reg::Rax); // the doorbell: KVM_EXIT_MMIO
    a.jmp(pass);
    a.finish().unwrap_or_default() // every label is bound
}

/// Counts a pass per doorbell; any other exit stops the vCPU.
fn exits() -> Arc<ExitHandler> {
    Arc::new(|_, exit: &VcpuExit<'_>| match exit {
        VcpuExit::MmioWrite(addr, _) if *addr == MMIO_DOORBELL_GPA => Ok(1),
        other => Err(format!("unexpected exit {other:?}")),
    })
}

/// The guest on either end: its VM and its running vCPUs.
pub struct WriterGuest {
    vm: Arc<KvmVm>,
    vcpus: KvmVcpus,
}

fn fresh_vm(kvm: &Kvm, log: KvmDirtyLog) -> Result<(Arc<KvmVm>, NewVcpus), Error> {
    let ram = Arc::new(KvmRam::new(&layout(), Backing::Anonymous)?);
    KvmVm::create(kvm, ram, 1, log, FIRST_SLOT)
}

impl WriterGuest {
    /// A fresh guest, loaded and running from counter 0.
    ///
    /// # Errors
    /// KVM's, the layout's.
    pub fn start(kvm: &Kvm, log: KvmDirtyLog) -> Result<WriterGuest, Error> {
        let (vm, fds) = fresh_vm(kvm, log)?;
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
        let fd = &fds.fds()[0];
        let mut sregs = fd
            .get_sregs()
            .map_err(|e| Error::from_errno("KVM_GET_SREGS", e))?;
        cpu_mode::set_user_long_mode(&mut sregs, GDT_GPA, tables.root_gpa());
        let mut regs = fd
            .get_regs()
            .map_err(|e| Error::from_errno("KVM_GET_REGS", e))?;
        (regs.rip, regs.rsp, regs.rflags) = (CODE_GPA, STACK_TOP_GPA, 2);
        (regs.rdi, regs.rsi, regs.r8, regs.rax) = (DATA_GVA, DATA_PAGES, MMIO_DOORBELL_GPA, 0);
        let state = [VcpuState { regs, sregs }];
        let vcpus = KvmVcpus::start(fds, Some(&state), exits(), false)?;
        Ok(WriterGuest { vm, vcpus })
    }

    /// Its VM.
    pub fn kvm_vm(&self) -> &Arc<KvmVm> {
        &self.vm
    }

    /// The vCPUs' registers (pauses them).
    ///
    /// # Errors
    /// KVM's.
    pub fn registers(&self) -> Result<Vec<VcpuState>, Error> {
        self.vcpus.save()
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

fn state_err(e: impl std::fmt::Display) -> MigrateError {
    MigrateError::BadState { why: e.to_string() }
}

/// The header's format: KVM's x86 tables are EPT's.
pub fn wire_format() -> WireFormat {
    WireFormat::from(FormatId::of::<EptFormat>())
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
            vcpus: 1,
            backing,
            format,
        }
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        Arc::new(GuestCounters::default)
    }
    fn state(&self, _pace: u64) -> Result<Vec<u8>, MigrateError> {
        let regs = self.vcpus.save().map_err(state_err)?;
        encode_vcpus(&regs).map_err(state_err)
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
}

impl ResumedGuest for WriterGuest {
    fn final_state(&self) -> Vec<u8> {
        let regs = self.vcpus.save().unwrap_or_default();
        encode_vcpus(&regs).unwrap_or_default()
    }
    fn progress(&self) -> Vec<u64> {
        self.vcpus.passes()
    }
}

/// What a destination's guest started from: every page's hash and the
/// counter (`rax`).
pub type Started = Arc<Mutex<Option<(Vec<u64>, u64)>>>;

/// The destination's factory: a blank guest of the same layout.
pub struct WriterDest {
    /// The dirty log the destination's VM keeps (for a later migration).
    pub log: KvmDirtyLog,
    /// Filled when the guest starts.
    pub started: Started,
}

/// A blank guest waiting for the stream.
pub struct BlankWriter {
    vm: Arc<KvmVm>,
    fds: Mutex<Option<NewVcpus>>,
    started: Started,
}

impl DestFactory for WriterDest {
    type Guest = BlankWriter;
    fn build(&self, h: &Header) -> Result<BlankWriter, MigrateError> {
        let size: u64 = layout().iter().map(|r| r.1).sum();
        if h.mem_size != size || h.slots != 3 || h.vcpus != 1 || h.gpa_base != 0 {
            return Err(MigrateError::Setup(format!(
                "not the writer guest's shape: {h:?}"
            )));
        }
        if h.format != wire_format() {
            return Err(MigrateError::Setup(format!(
                "tables {:?}, not EPT",
                h.format
            )));
        }
        let kvm = crate::open_kvm().map_err(|e| MigrateError::Setup(e.to_string()))?;
        let (vm, fds) = fresh_vm(&kvm, self.log).map_err(|e| MigrateError::Setup(e.to_string()))?;
        Ok(BlankWriter {
            vm,
            fds: Mutex::new(Some(fds)),
            started: self.started.clone(),
        })
    }
}

impl DestGuest for BlankWriter {
    type Vm = KvmVm;
    type State = Vec<VcpuState>;
    type Running = WriterGuest;
    fn vm(&self) -> &Arc<KvmVm> {
        &self.vm
    }
    fn decode_state(
        &self,
        body: &[u8],
        h: &Header,
        _: u64,
    ) -> Result<Vec<VcpuState>, MigrateError> {
        decode_vcpus(body, h.vcpus as usize).map_err(state_err)
    }
    fn start(&self, state: &Vec<VcpuState>) -> Result<WriterGuest, MigrateError> {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner()).take();
        let fds = fds.ok_or_else(|| state_err("the guest was started already"))?;
        let counter = state.first().map_or(0, |s| s.regs.rax);
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((self.vm.ram().page_hashes(), counter));
        let vcpus = KvmVcpus::start(fds, Some(state), exits(), false).map_err(state_err)?;
        Ok(WriterGuest {
            vm: self.vm.clone(),
            vcpus,
        })
    }
}
