//! EL2's state for one VM and the dispatcher of the host's commands.

use alloc::sync::Arc;
use alloc::vec::Vec;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, MemslotStore, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, FaultOutcome, HugePageRecovery, Mmu, MmuPolicy, Protect, VcpuMmu};
use s2mmu::{Error, Gpa, Hva, TlbInvalidate};

use crate::abi::{Command, Counters, HypError, LogMode, Op};
use crate::abort::{AbortOutcome, Refusal, Stage2Abort};
use crate::check::{self, Layout, Region, IPA_BITS};
use crate::platform::El2Platform;
use crate::pool::{PagePool, PoolMmOps};

/// Memslots a VM may have (ids `0..MAX_SLOTS`).
pub const MAX_SLOTS: usize = 32;
/// vCPUs a VM may have.
pub const MAX_VCPUS: u64 = 8;
/// Bit 0 of `MEMSLOT_SET`'s flags: log dirty pages.
pub const FLAG_LOG: u64 = 1;
/// Bit 1 of `MEMSLOT_SET`'s flags: read-only.
pub const FLAG_READONLY: u64 = 2;

/// The engine as EL2 runs it: arm64 stage 2 with 4 KiB pages, tables from
/// the carve-out's [`PagePool`], memslots in the tree store, the EL2
/// platform.
pub type El2Mmu = Mmu<Arm64Stage2, PoolMmOps, TreeMemslots<El2Platform>, El2Platform>;

/// EL2's record of a slot, kept beside the engine's for the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRecord {
    /// Guest-physical base.
    pub ipa: u64,
    /// Bytes.
    pub size: u64,
    /// Physical base of the backing.
    pub backing: u64,
    /// `MEMSLOT_SET` flags.
    pub flags: u64,
    /// The largest mapping the backing allows.
    pub page_size: u64,
}

pub(crate) struct Vm {
    pub(crate) mmu: El2Mmu,
    pub(crate) vcpus: Vec<VcpuMmu<PoolMmOps>>,
    pub(crate) mode: LogMode,
    pub(crate) ring_entries: u64,
    pub(crate) slots: [Option<SlotRecord>; MAX_SLOTS],
}

/// EL2's state: the machine's layout, the carve-out's table pool, the TLB
/// backend, the VM (once created) and the counters.
pub struct Hyp {
    pub(crate) layout: Layout,
    pool: Arc<PagePool>,
    tlb: Arc<dyn TlbInvalidate>,
    pub(crate) vm: Option<Vm>,
    pub(crate) counters: Counters,
}

// SAFETY: the only non-Send field is the shared area's address in
// `layout`, which `Hyp::new`'s caller vouches for; everything it points to
// is reached through volatile accesses by whoever holds the `Hyp`.
unsafe impl Send for Hyp {}

fn engine_error(e: Error) -> HypError {
    match e {
        Error::OutOfMemory | Error::CacheExhausted { .. } => HypError::OutOfMemory,
        Error::NoSuchSlot { .. } => HypError::NoSuchSlot,
        _ => HypError::Engine,
    }
}

impl Hyp {
    /// EL2's state over `layout`, stage-2 tables from `pool`, invalidations
    /// to `tlb`.
    ///
    /// # Safety
    /// `layout.shared_va` reaches `layout.shared.size` bytes of memory that
    /// stay mapped for as long as this value lives (the host may write them
    /// at any time: EL2 only reads and writes them by volatile accesses);
    /// `pool`'s pages lie inside `layout.carve_out`.
    ///
    /// # Errors
    /// The layout's own check ([`Layout::validate`]), or
    /// [`HypError::CarveOut`] if the pool is not inside the carve-out.
    pub unsafe fn new(
        layout: Layout,
        pool: Arc<PagePool>,
        tlb: Arc<dyn TlbInvalidate>,
    ) -> Result<Self, HypError> {
        layout.validate()?;
        let (base, size) = pool.range();
        if !layout.carve_out.contains(base, size) {
            return Err(HypError::CarveOut);
        }
        Ok(Hyp {
            layout,
            pool,
            tlb,
            vm: None,
            counters: Counters::default(),
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// EL2's record of slot `id`, if it exists.
    pub fn slot(&self, id: usize) -> Option<SlotRecord> {
        self.vm
            .as_ref()
            .and_then(|v| v.slots.get(id).copied().flatten())
    }

    /// The VM's engine, if a VM exists.
    pub fn mmu(&self) -> Option<&El2Mmu> {
        self.vm.as_ref().map(|v| &v.mmu)
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        c.table_pages = self.pool.used_pages() as u64;
        if let Some(vm) = &self.vm {
            for v in &vm.vcpus {
                c.translation += v.stats.translation;
                c.permission += v.stats.permission;
                c.dirtied += v.stats.dirtied;
            }
            c.collapsed = vm.mmu.vm_stats().collapsed;
        }
        c
    }

    /// Answers a command block: checks, acts, and writes `status` and
    /// `ret` (zeroed on error, the state unchanged).
    pub fn dispatch(&mut self, cmd: &mut Command) {
        let r = match Op::from_code(cmd.op) {
            Some(op) => self.call(op, &cmd.args),
            None => Err(HypError::UnknownOp),
        };
        match r {
            Ok(ret) => {
                cmd.status = 0;
                cmd.ret = ret;
                self.counters.commands_ok += 1;
            }
            Err(e) => {
                cmd.status = e.status();
                cmd.ret = [0; 4];
                self.counters.commands_refused += 1;
            }
        }
    }

    /// Runs `op` with `args` (the dispatcher without the block).
    ///
    /// # Errors
    /// The first check the arguments fail, or the engine's refusal.
    pub fn call(&mut self, op: Op, args: &[u64; 6]) -> Result<[u64; 4], HypError> {
        let one = |v: u64| [v, 0, 0, 0];
        match op {
            Op::VmInit => self.vm_init(args).map(one),
            Op::VmDestroy => self.vm_destroy().map(|()| [0; 4]),
            Op::MemslotSet => self.memslot_set(args).map(|()| [0; 4]),
            Op::LogSet => self.log_set(args).map(|()| [0; 4]),
            Op::GetDirty => self.get_dirty(args).map(one),
            Op::ClearDirty => self.clear_dirty(args).map(one),
            Op::RingHarvest => self.ring_harvest(args).map(one),
            Op::RingReset => self.ring_reset().map(one),
            Op::UnmapRange => self.unmap_range(args).map(one),
            Op::Collapse => self.collapse(args).map(one),
            Op::Counters => self.write_counters(args).map(|()| [0; 4]),
        }
    }

    pub(crate) fn vm(&self) -> Result<&Vm, HypError> {
        self.vm.as_ref().ok_or(HypError::NoVm)
    }

    /// The VM and slot `args[0]`'s record: [`HypError::NoVm`],
    /// [`HypError::SlotOutOfRange`], [`HypError::NoSuchSlot`].
    pub(crate) fn slot_arg(&self, id: u64) -> Result<(&Vm, u16, SlotRecord), HypError> {
        let vm = self.vm()?;
        let i = usize::try_from(id)
            .ok()
            .filter(|&i| i < MAX_SLOTS)
            .ok_or(HypError::SlotOutOfRange)?;
        let rec = vm.slots[i].ok_or(HypError::NoSuchSlot)?;
        Ok((vm, i as u16, rec))
    }

    /// `VM_INIT`: mode, ring entries (ring only: a power of two,
    /// 256..=65536; else 0), vCPUs (1..=[`MAX_VCPUS`]).
    fn vm_init(&mut self, args: &[u64; 6]) -> Result<u64, HypError> {
        if self.vm.is_some() {
            return Err(HypError::VmExists);
        }
        let mode = LogMode::from_code(args[0]).ok_or(HypError::BadArgument)?;
        let entries = args[1];
        let entries_ok = match mode {
            LogMode::Ring => entries.is_power_of_two() && (256..=65536).contains(&entries),
            _ => entries == 0,
        };
        if !entries_ok || !(1..=MAX_VCPUS).contains(&args[2]) || args[3..] != [0; 3] {
            return Err(HypError::BadArgument);
        }
        let dirty = match mode {
            LogMode::Wp => DirtyMode::Bitmap {
                protect: Protect::OnGet,
            },
            LogMode::Manual => DirtyMode::WP,
            LogMode::Ring => DirtyMode::Ring {
                entries: entries as u32,
            },
            LogMode::Hw => DirtyMode::HW,
        };
        let policy = MmuPolicy {
            dirty,
            huge_page_recovery: HugePageRecovery::Collapse,
            ..MmuPolicy::default()
        };
        let fmt = Arm64Stage2::new(Granule::K4, IPA_BITS).map_err(engine_error)?;
        let slots = <TreeMemslots<El2Platform> as MemslotStore>::with_config(MemslotConfig {
            max_user_slots: MAX_SLOTS as u16,
            ..MemslotConfig::default()
        });
        let mm = PoolMmOps::new(self.pool.clone());
        let mmu =
            Mmu::for_platform(fmt, mm, self.tlb.clone(), slots, policy).map_err(engine_error)?;
        let vcpus = (0..args[2])
            .map(|_| mmu.new_vcpu())
            .collect::<Result<Vec<_>, _>>()
            .map_err(engine_error)?;
        let root = mmu.with_table(|pt| pt.root_pa());
        self.vm = Some(Vm {
            mmu,
            vcpus,
            mode,
            ring_entries: entries,
            slots: [None; MAX_SLOTS],
        });
        Ok(root)
    }

    /// `VM_DESTROY`: the VM's tables go back to the pool, then the VMID's
    /// TLB entries are flushed before any page can be reused. The host
    /// stops every vCPU of the VM first.
    fn vm_destroy(&mut self) -> Result<(), HypError> {
        self.vm.take().ok_or(HypError::NoVm)?;
        self.tlb.flush_vmid();
        Ok(())
    }

    /// `MEMSLOT_SET` ([`crate::abi`]): every check before the engine sees
    /// the request; see `docs/el2.md` for their order.
    fn memslot_set(&mut self, args: &[u64; 6]) -> Result<(), HypError> {
        let [id, flags, ipa, size, backing, page_size] = *args;
        let vm = self.vm()?;
        let i = usize::try_from(id)
            .ok()
            .filter(|&i| i < MAX_SLOTS)
            .ok_or(HypError::SlotOutOfRange)?;
        if flags & !(FLAG_LOG | FLAG_READONLY) != 0 {
            return Err(HypError::BadArgument);
        }
        let old = vm.slots[i];
        let region = if size == 0 {
            let o = old.ok_or(HypError::NoSuchSlot)?;
            UserMemoryRegion::new(
                i as u16,
                SlotFlags::NONE,
                Gpa::new(o.ipa),
                0,
                Hva::new(o.backing),
            )
        } else {
            self.check_new_slot(i, old, args)?;
            let f = SlotFlags::from_bits(flags as u32);
            UserMemoryRegion::new(i as u16, f, Gpa::new(ipa), size, Hva::new(backing))
        };
        let ps = if size == 0 { check::PAGE } else { page_size };
        vm.mmu
            .set_memory_region(&region, ps)
            .map_err(engine_error)?;
        let rec = (size != 0).then_some(SlotRecord {
            ipa,
            size,
            backing,
            flags,
            page_size,
        });
        if let Some(vm) = self.vm.as_mut() {
            vm.slots[i] = rec;
        }
        Ok(())
    }

    /// The checks of a slot being created, moved or given new flags.
    fn check_new_slot(
        &self,
        i: usize,
        old: Option<SlotRecord>,
        args: &[u64; 6],
    ) -> Result<(), HypError> {
        let [_, _, ipa, size, backing, page_size] = *args;
        if ![check::PAGE, 2 << 20, 1 << 30].contains(&page_size) {
            return Err(HypError::BadArgument);
        }
        check::guest_range(ipa, size)?;
        self.layout.check_backing(backing, size)?;
        if let Some(o) = old {
            if (o.backing, o.size) != (backing, size) {
                return Err(HypError::BackingChanged);
            }
        }
        let others = self.vm()?.slots.iter().enumerate();
        for (_, s) in others.filter(|(j, _)| *j != i) {
            let Some(s) = s else { continue };
            if Region::new(s.ipa, s.size).overlaps(ipa, size) {
                return Err(HypError::SlotOverlap);
            }
            if Region::new(s.backing, s.size).overlaps(backing, size) {
                return Err(HypError::BackingOverlap);
            }
        }
        Ok(())
    }

    /// `LOG_SET`: slot, on (0/1), mode (the VM's, when turning on).
    fn log_set(&mut self, args: &[u64; 6]) -> Result<(), HypError> {
        let (vm, id, rec) = self.slot_arg(args[0])?;
        let on = match args[1] {
            0 => false,
            1 => true,
            _ => return Err(HypError::BadArgument),
        };
        if on && LogMode::from_code(args[2]) != Some(vm.mode) {
            return Err(HypError::WrongMode);
        }
        if on {
            vm.mmu.enable_dirty_logging(id)
        } else {
            vm.mmu.disable_dirty_logging(id)
        }
        .map_err(engine_error)?;
        self.set_log_flag(id, rec, on);
        Ok(())
    }

    pub(crate) fn set_log_flag(&mut self, id: u16, rec: SlotRecord, on: bool) {
        let flags = if on {
            rec.flags | FLAG_LOG
        } else {
            rec.flags & !FLAG_LOG
        };
        if let Some(vm) = self.vm.as_mut() {
            vm.slots[usize::from(id)] = Some(SlotRecord { flags, ..rec });
        }
    }

    /// `UNMAP_RANGE`: the MMU notifier over backing memory.
    fn unmap_range(&mut self, args: &[u64; 6]) -> Result<u64, HypError> {
        let vm = self.vm()?;
        let [base, size, ..] = *args;
        check::pages(base, size)?;
        if self.layout.carve_out.overlaps(base, size) {
            return Err(HypError::CarveOut);
        }
        let m = &vm.mmu;
        let n = m
            .invalidate_hva_range_start(Hva::new(base), size)
            .map_err(engine_error)?;
        m.invalidate_hva_range_end(Hva::new(base), size)
            .map_err(engine_error)?;
        Ok(n)
    }

    /// `COLLAPSE`: logging off on a logging slot, its pages collapsed back
    /// into blocks in place (the VM's huge-page recovery).
    fn collapse(&mut self, args: &[u64; 6]) -> Result<u64, HypError> {
        let (vm, id, rec) = self.slot_arg(args[0])?;
        if rec.flags & FLAG_LOG == 0 {
            return Err(HypError::NotLogging);
        }
        let before = vm.mmu.vm_stats().collapsed;
        vm.mmu.disable_dirty_logging(id).map_err(engine_error)?;
        let n = vm.mmu.vm_stats().collapsed - before;
        self.set_log_flag(id, rec, false);
        Ok(n)
    }

    /// Answers vCPU `vcpu`'s stage-2 abort with the engine: a first touch
    /// maps from the slot's backing, a write-protection fault under
    /// logging marks the page dirty; an IPA no slot covers is refused
    /// (never mapped), and so is one in the carve-out, which no slot can
    /// cover.
    pub fn handle_abort(&mut self, vcpu: usize, abort: &Stage2Abort) -> AbortOutcome {
        let out = self.abort_outcome(vcpu, abort);
        let c = &mut self.counters;
        match out {
            AbortOutcome::Handled { .. } => c.aborts_handled += 1,
            AbortOutcome::Refused(_) => c.aborts_refused += 1,
            AbortOutcome::ToHost => c.aborts_to_host += 1,
        }
        out
    }

    fn abort_outcome(&mut self, vcpu: usize, abort: &Stage2Abort) -> AbortOutcome {
        let Some(kind) = abort.kind() else {
            return AbortOutcome::Refused(Refusal::NotStage2);
        };
        let ipa = abort.ipa();
        let carve = self.layout.carve_out.overlaps(ipa, 1);
        let Some(vm) = self.vm.as_mut() else {
            return AbortOutcome::ToHost;
        };
        let Some(v) = vm.vcpus.get_mut(vcpu) else {
            return AbortOutcome::ToHost;
        };
        let permission = matches!(kind, s2mmu::mmu::FaultKind::Permission { .. });
        match vm
            .mmu
            .handle_stage2_fault(v, Gpa::new(ipa), abort.is_write(), kind)
        {
            Ok(FaultOutcome::Fast | FaultOutcome::Slow | FaultOutcome::Spurious)
            | Ok(FaultOutcome::Retry) => AbortOutcome::Handled { permission },
            Err(Error::NoSlot { .. }) if carve => AbortOutcome::Refused(Refusal::CarveOut),
            Err(Error::NoSlot { .. }) => AbortOutcome::Refused(Refusal::NoSlot),
            Err(Error::WriteToReadOnly { .. }) => AbortOutcome::Refused(Refusal::ReadOnly),
            Err(_) => AbortOutcome::ToHost,
        }
    }
}
