//! A VM on the arm64 model: the engine's [`Mmu`] with its tables in the
//! machine's RAM, vCPU threads that answer the stub's exits with the
//! engine's fault path, and probes that ask the architecture what it makes
//! of the tables.

use crate::arena::ArenaMmOps;
use crate::layout;
use crate::machine::{Exit, Machine, SharedRam};
use crate::probe;
use crate::stage2;
use crate::tlbi::{HypSink, HypTlbi};
use crate::{Arm64Error, Result};
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{FaultKind, HostMemory, Mmu, MmuPolicy, VcpuMmu};
use s2mmu::tlb::arm64::Arm64TlbiFeatures;
use s2mmu::{Gpa, Hva, Pa};
use s2mmu::{PteFormat, TlbInvalidate};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The engine's MMU as the arm64 model runs it.
pub type Arm64Mmu = Mmu<Arm64Stage2, ArenaMmOps, TreeMemslots>;

/// What a page the host moved away from holds afterwards.
pub const POISON: u64 = 0xdead_beef_dead_beef;

/// Memslot id of the guest code.
pub const CODE_SLOT: u16 = 0;

/// The host memory behind memslots: the machine's RAM, whose host
/// addresses map to guest-physical ones by an offset, except for pages the
/// host has moved ([`Arm64Vm::remap_host_page`]).
struct RamHost {
    ram: Arc<SharedRam>,
    page: u64,
    moved: Mutex<BTreeMap<u64, u64>>,
    any_moved: AtomicBool,
}

impl RamHost {
    fn linear(&self, hva: u64, size: u64) -> Option<u64> {
        let pa = self.ram.pa(hva)?;
        self.ram.contains(pa, size).then_some(pa)
    }
}

impl HostMemory for RamHost {
    fn host_to_phys(&self, hva: Hva, size: u64) -> Option<Pa> {
        let hva = hva.raw();
        if !self.any_moved.load(Ordering::Acquire) {
            return self.linear(hva, size).map(Pa::new);
        }
        let moved = self.moved.lock().unwrap();
        let mut inside = moved.range(hva..hva.saturating_add(size));
        let pa = match inside.next() {
            None => self.linear(hva, size),
            // A moved page is contiguous only with itself.
            Some((&at, &pa)) if at == hva && size == self.page => Some(pa),
            Some(_) => None,
        };
        pa.map(Pa::new)
    }
    // QEMU models no caches: the maintenance hooks stay no-ops.
}

/// How to make a VM.
#[derive(Clone, Copy, Debug)]
pub struct VmConfig {
    /// Translation granule.
    pub granule: Granule,
    /// IPA size in bits.
    pub ipa_bits: u32,
    /// The engine's policies.
    pub policy: MmuPolicy,
    /// Bytes of the table arena (at most `DATA - TABLES`).
    pub table_bytes: u64,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            granule: Granule::K4,
            ipa_bits: 40,
            policy: MmuPolicy::default(),
            table_bytes: 64 << 20,
        }
    }
}

/// An engine-driven VM on a [`Machine`].
pub struct Arm64Vm {
    machine: Arc<Machine>,
    mmu: Arc<Arm64Mmu>,
    host: Arc<RamHost>,
    sink: Arc<HypSink>,
    vtcr: u64,
    vttbr: u64,
    fmt: Arm64Stage2,
    mmio: Mutex<Option<Box<MmioHandler>>>,
}

/// One guest access to an IPA no memslot covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioAccess {
    /// The vCPU (CPU) that made it.
    pub cpu: usize,
    /// The IPA.
    pub ipa: u64,
    /// Bytes (1, 2, 4 or 8).
    pub size: u64,
    /// `Some(value)` for a write, `None` for a read.
    pub write: Option<u64>,
}

/// A device model: answers an MMIO access (a read's value; ignored for a
/// write).
pub type MmioHandler = dyn Fn(MmioAccess) -> u64 + Send + Sync;

/// What the host does with an abort.
enum AbortAnswer {
    /// The engine mapped or fixed the page: retry, after this maintenance.
    Retry(Vec<(u64, u64)>),
    /// A device model emulated the access: skip it (a read gets the value).
    Mmio(u64),
}

/// What the host answers to a guest's HVC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HvcAnswer {
    /// Resume with these x0 and x1.
    Resume(u64, u64),
    /// Stop the guest; the run ends.
    Stop,
}

/// Counters of one vCPU's run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Stage-2 aborts handled.
    pub aborts: u64,
    /// HVC exits.
    pub hvcs: u64,
    /// Wall time the engine spent in the fault path, in ns.
    pub engine_ns: u64,
    /// Wall time from seeing an abort to answering it, in ns (engine
    /// included).
    pub host_ns: u64,
    /// Aborts a device model emulated (MMIO).
    pub mmio: u64,
}

/// Decodes a data or instruction abort's fault status code into what the
/// engine's fault path takes; `None` for codes it does not handle.
pub fn fault_kind(dfsc: u64) -> Option<FaultKind> {
    let level = (dfsc & 3) as u32;
    match dfsc >> 2 {
        0b0001 => Some(FaultKind::Translation),
        0b0011 => Some(FaultKind::Permission { level }),
        _ => None,
    }
}

impl Arm64Vm {
    /// A VM whose guest code is mapped from the image's guest section.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] for a table arena that does not fit;
    /// [`Arm64Error::Engine`] for a format or policy the engine refuses.
    pub fn new(machine: Arc<Machine>, cfg: &VmConfig) -> Result<Arm64Vm> {
        let vm = Arm64Vm::new_bare(machine, cfg)?;
        let shift = vm.fmt.page_shift();
        let ram = vm.machine.ram().clone();
        let code_hva = ram.hva(layout::GUEST_TEXT).expect("guest text in RAM");
        let code = UserMemoryRegion::new(
            CODE_SLOT,
            SlotFlags::NONE,
            Gpa::new(layout::GUEST_TEXT),
            layout::GUEST_TEXT_SIZE.max(1 << shift),
            Hva::new(code_hva),
        );
        vm.mmu.set_memory_region(&code, 1 << shift)?;
        // Map the code now: probes run it without a vCPU to fault it in.
        let pages = layout::GUEST_TEXT_SIZE.max(1 << shift) >> shift;
        vm.mmu.populate(CODE_SLOT, 0, pages)?;
        Ok(vm)
    }

    /// A VM with no memslot at all (a Linux guest brings its own RAM).
    ///
    /// # Errors
    /// As [`Arm64Vm::new`].
    pub fn new_bare(machine: Arc<Machine>, cfg: &VmConfig) -> Result<Arm64Vm> {
        if cfg.table_bytes == 0 || cfg.table_bytes > layout::DATA - layout::TABLES {
            return Err(Arm64Error::Config(format!(
                "table arena of {:#x} bytes: must be 1..={:#x}",
                cfg.table_bytes,
                layout::DATA - layout::TABLES
            )));
        }
        let fmt = Arm64Stage2::new(cfg.granule, cfg.ipa_bits)?;
        let shift = fmt.page_shift();
        let ram = machine.ram().clone();
        let arena = ArenaMmOps::new(ram.clone(), layout::TABLES, cfg.table_bytes, 1 << shift)?;
        // The service CPU wakes at the host's bell: a parked one (a
        // migration's destination before its state, a source while it
        // logs) then answers at once (`HypSink::wake_service`).
        machine.mailbox(machine.cpus() - 1).route_bell_in()?;
        let sink = Arc::new(HypSink::new(machine.clone(), machine.cpus() - 1));
        let features = Arm64TlbiFeatures {
            range: true,
            ttl: true,
            lpa2: fmt.lpa2(),
        };
        let tlb: Arc<dyn TlbInvalidate> = Arc::new(HypTlbi::new(sink.clone(), shift, features));
        let slots = TreeMemslots::with_config(MemslotConfig {
            page_shift: shift,
            ..MemslotConfig::default()
        });
        let host = Arc::new(RamHost {
            ram: ram.clone(),
            page: 1 << shift,
            moved: Mutex::new(BTreeMap::new()),
            any_moved: AtomicBool::new(false),
        });
        let mmu = Mmu::new(fmt, arena, tlb, slots, cfg.policy)?.with_host_memory(host.clone());
        let root = mmu.with_table(|pt| pt.root_pa());
        let vtcr = stage2::vtcr(&fmt, cfg.policy.dirty.hardware());
        let vttbr = stage2::vttbr(root, stage2::VMID);
        sink.set_context(vtcr, vttbr);
        Ok(Arm64Vm {
            machine,
            mmu: Arc::new(mmu),
            host,
            sink,
            vtcr,
            vttbr,
            fmt,
            mmio: Mutex::new(None),
        })
    }

    /// The engine's MMU.
    pub fn mmu(&self) -> &Arc<Arm64Mmu> {
        &self.mmu
    }

    /// The TLB sink (counters, fault injection).
    pub fn sink(&self) -> &Arc<HypSink> {
        &self.sink
    }

    /// The machine.
    pub fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// The format.
    pub fn format(&self) -> &Arm64Stage2 {
        &self.fmt
    }

    /// VTCR_EL2 and VTTBR_EL2 the VM runs with.
    pub fn stage2_regs(&self) -> (u64, u64) {
        (self.vtcr, self.vttbr)
    }

    /// Sets the VTCR_EL2 the guest and the maintenance run with (hardware
    /// dirty state turns HA/HD on).
    pub fn set_vtcr(&mut self, vtcr: u64) {
        self.vtcr = vtcr;
        self.sink.set_context(vtcr, self.vttbr);
    }

    /// The physical address behind the host page at `hva` now.
    pub fn host_page_pa(&self, hva: u64) -> Option<u64> {
        self.host
            .host_to_phys(Hva::new(hva), self.host.page)
            .map(Pa::raw)
    }

    /// Moves the host page at `hva` to physical address `new_pa`, as a host
    /// kernel migrating a page does, while the guest may be using it: the
    /// engine's MMU notifier unmaps it (break-before-make, invalidated on
    /// every CPU) and holds faults on it, the content is copied, the host
    /// mapping switched, and faults map the new page.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] for an address that is not a page of guest
    /// data RAM, or a target that is not; the engine's errors.
    pub fn remap_host_page(&self, hva: u64, new_pa: u64) -> Result<()> {
        let page = self.host.page;
        let ram = self.machine.ram();
        let old_pa = self
            .host_page_pa(hva)
            .filter(|&pa| hva.is_multiple_of(page) && pa >= layout::DATA)
            .ok_or_else(|| Arm64Error::Config(format!("{hva:#x} is not a guest data page")))?;
        if !new_pa.is_multiple_of(page) || new_pa < layout::DATA || !ram.contains(new_pa, page) {
            return Err(Arm64Error::Config(format!(
                "{new_pa:#x} is not a guest data page"
            )));
        }
        self.mmu.invalidate_hva_range_start(Hva::new(hva), page)?;
        // No CPU can reach the old page through stage 2 now.
        for off in (0..page).step_by(8) {
            ram.write(new_pa + off, ram.read(old_pa + off));
        }
        self.host.moved.lock().unwrap().insert(hva, new_pa);
        self.host.any_moved.store(true, Ordering::Release);
        self.mmu.invalidate_hva_range_end(Hva::new(hva), page)?;
        // The host reuses the old page: anything that still reaches it
        // through a stale translation reads poison, not its data.
        for off in (0..page).step_by(8) {
            ram.write(old_pa + off, POISON);
        }
        Ok(())
    }

    /// Installs a device model for guest accesses to IPAs no memslot
    /// covers (else such an access ends the run with an error).
    pub fn set_mmio_handler(&self, handler: Box<MmioHandler>) {
        *self.mmio.lock().unwrap() = Some(handler);
    }

    /// Adds memslot `id` at `gpa` over `size` bytes of RAM at `pa`,
    /// backed by host pages of `host_page` bytes (the largest block a fault
    /// may map).
    ///
    /// # Errors
    /// [`Arm64Error::Config`] for a range outside RAM; the engine's memslot
    /// errors.
    pub fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, host_page: u64) -> Result<()> {
        let ram = self.machine.ram();
        if pa < layout::DATA || !ram.contains(pa, size) {
            return Err(Arm64Error::Config(format!(
                "slot {id}: {pa:#x}+{size:#x} is not inside guest data RAM"
            )));
        }
        let hva = ram.hva(pa).expect("checked above");
        let r = UserMemoryRegion::new(id, SlotFlags::NONE, Gpa::new(gpa), size, Hva::new(hva));
        self.mmu.set_memory_region(&r, host_page)?;
        Ok(())
    }

    /// Runs guest code at `entry` with x0..x7 = `args` on CPU `cpu`,
    /// answering its stage-2 aborts with the engine's fault path and its
    /// HVCs with `on_hvc`, until `on_hvc` stops it.
    ///
    /// # Errors
    /// [`Arm64Error::Guest`] for an exit the engine cannot handle (MMIO, an
    /// unknown exception, a fault status it does not know); the engine's
    /// errors; [`Arm64Error::Boot`] if QEMU stops answering.
    pub fn run(
        &self,
        cpu: usize,
        vcpu: &mut VcpuMmu<ArenaMmOps>,
        entry: u64,
        args: [u64; 8],
        mut on_hvc: impl FnMut(&Exit) -> HvcAnswer,
    ) -> Result<RunStats> {
        if cpu + 1 >= self.machine.cpus() {
            return Err(Arm64Error::Config(format!(
                "CPU {cpu} is not a guest CPU (the last of {} serves maintenance)",
                self.machine.cpus()
            )));
        }
        let mbox = self.machine.mailbox(cpu);
        let mut last = mbox.poll_exit(u64::MAX).map_or(0, |e| e.seq);
        let mut a = [0u64; 12];
        a[..4].copy_from_slice(&[self.vtcr, self.vttbr, stage2::HCR_GUEST, entry]);
        a[4..].copy_from_slice(&args);
        let run = mbox.post(layout::CMD_RUN, &a);
        let mut st = RunStats::default();
        loop {
            let mut exit = None;
            self.machine.wait("a guest exit", Instant::now(), || {
                exit = mbox.poll_exit(last);
                exit.is_some() || mbox.done(run)
            })?;
            let Some(e) = exit else { break };
            last = e.seq;
            match e.kind {
                layout::EXIT_ABORT => {
                    let t0 = Instant::now();
                    st.aborts += 1;
                    let r = self.handle_abort(cpu, vcpu, &e, &mut st);
                    match r {
                        Ok(AbortAnswer::Retry(insns)) => {
                            mbox.reply(&e, layout::ACT_RESUME, [0, 0], &insns);
                            st.host_ns += t0.elapsed().as_nanos() as u64;
                        }
                        Ok(AbortAnswer::Mmio(value)) => {
                            mbox.reply(&e, layout::ACT_MMIO, [value, 0], &[]);
                            st.mmio += 1;
                        }
                        Err(err) => {
                            mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
                            self.wait_done(cpu, run)?;
                            return Err(err);
                        }
                    }
                }
                layout::EXIT_HVC => {
                    st.hvcs += 1;
                    match on_hvc(&e) {
                        HvcAnswer::Resume(x0, x1) => {
                            mbox.reply(&e, layout::ACT_RESUME_X0, [x0, x1], &[])
                        }
                        HvcAnswer::Stop => mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]),
                    }
                }
                _ => {
                    mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
                    self.wait_done(cpu, run)?;
                    return Err(Arm64Error::Guest(format!(
                        "unexpected exit: ESR_EL2 {:#x} at {:#x}",
                        e.esr, e.elr
                    )));
                }
            }
        }
        let bad = mbox.bad_insns();
        if bad != 0 {
            return Err(Arm64Error::Guest(format!(
                "the stub met {bad:#x} unknown maintenance instructions"
            )));
        }
        Ok(st)
    }

    /// Waits until RUN command `run` on `cpu` has finished (after a stop).
    fn wait_done(&self, cpu: usize, run: u64) -> Result<()> {
        let mbox = self.machine.mailbox(cpu);
        self.machine
            .wait("a stopped guest", Instant::now(), || mbox.done(run))
    }

    /// Handles stage-2 abort `e` of `vcpu` with the engine's fault path:
    /// the maintenance the answer must execute before the guest retries,
    /// or the engine's error ([`s2mmu::Error::NoSlot`] for an IPA no
    /// memslot covers: MMIO).
    ///
    /// # Errors
    /// [`Arm64Error::Guest`] for a fault status the engine does not handle.
    pub fn fault(
        &self,
        vcpu: &mut VcpuMmu<ArenaMmOps>,
        e: &Exit,
    ) -> Result<s2mmu::Result<Vec<(u64, u64)>>> {
        let ipa = e.ipa();
        let kind = fault_kind(e.dfsc()).ok_or_else(|| {
            Arm64Error::Guest(format!(
                "abort at IPA {ipa:#x} with fault status {:#x} (ESR_EL2 {:#x})",
                e.dfsc(),
                e.esr
            ))
        })?;
        // A permission fault on the guest's stage-1 walk (ESR ISS.S1PTW) is
        // the walker's hardware update of a descriptor (access flag, dirty
        // state): a write, whatever WnR says (QEMU reports it as a read).
        // KVM's kvm_is_write_fault() decides the same way.
        let s1ptw = e.esr & (1 << 7) != 0;
        let write = e.write() || (s1ptw && matches!(kind, FaultKind::Permission { .. }));
        let (r, insns) = self.sink.collect_for_fault(|| {
            self.mmu
                .handle_stage2_fault(vcpu, Gpa::new(ipa), write, kind)
        });
        Ok(r.map(|_| insns))
    }

    fn handle_abort(
        &self,
        cpu: usize,
        vcpu: &mut VcpuMmu<ArenaMmOps>,
        e: &Exit,
        st: &mut RunStats,
    ) -> Result<AbortAnswer> {
        let t0 = Instant::now();
        let r = self.fault(vcpu, e)?;
        st.engine_ns += t0.elapsed().as_nanos() as u64;
        match r {
            Ok(insns) => Ok(AbortAnswer::Retry(insns)),
            Err(s2mmu::Error::NoSlot { gpa }) => {
                let handler = self.mmio.lock().unwrap();
                let (Some(h), Some(size)) = (handler.as_ref(), e.access_size()) else {
                    return Err(Arm64Error::Guest(format!(
                        "MMIO access at IPA {gpa:#x} (ELR {:#x}): no device model, or no \
                         instruction syndrome to emulate it with",
                        e.elr
                    )));
                };
                let mask = if size == 8 {
                    u64::MAX
                } else {
                    (1 << (size * 8)) - 1
                };
                let write = e.write().then_some(e.rt & mask);
                let v = h(MmioAccess {
                    cpu,
                    ipa: gpa.raw(),
                    size,
                    write,
                });
                Ok(AbortAnswer::Mmio(v & mask))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// What the architecture's walker makes of `ipas` on CPU `cpu`
    /// ([`crate::probe::at`] with this VM's tables).
    ///
    /// # Errors
    /// As [`crate::probe::at`].
    pub fn at(&self, cpu: usize, ipas: &[u64], write: bool) -> Result<Vec<u64>> {
        probe::at(&self.machine, self.stage2_regs(), cpu, ipas, write)
    }

    /// One guest access on CPU `cpu` ([`crate::probe::access`] with this
    /// VM's tables; the engine does not handle the abort).
    ///
    /// # Errors
    /// As [`crate::probe::access`].
    pub fn probe(
        &self,
        cpu: usize,
        ipa: u64,
        write: Option<u64>,
    ) -> Result<std::result::Result<u64, Exit>> {
        probe::access(&self.machine, self.stage2_regs(), cpu, ipa, write)
    }
}
