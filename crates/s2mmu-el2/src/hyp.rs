//! EL2's state for one VM and the dispatcher of the host's commands.

use alloc::sync::Arc;
use alloc::vec::Vec;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, MemslotStore, TreeMemslots};
use s2mmu::mmu::{DirtyMode, FaultOutcome, HugePageRecovery, Mmu, MmuPolicy, Protect, VcpuMmu};
use s2mmu::{Error, Gpa, TlbInvalidate};

use crate::abi::{Command, Counters, HypError, LogMode, Op};
use crate::abort::{AbortOutcome, Refusal, Stage2Abort};
use crate::check::{Layout, IPA_BITS};
use crate::el2_host::El2Host;
use crate::pace::{Brakes, VcpuBrake};
use crate::platform::{El2Platform, RawMutex, RawRwLock};
use crate::pool::{PagePool, PoolMmOps};
use core::sync::atomic::{AtomicU64, Ordering};

/// Memslots a VM may have (ids `0..MAX_SLOTS`).
pub const MAX_SLOTS: usize = 32;
/// vCPUs a VM may have.
pub const MAX_VCPUS: u64 = 8;
/// Bit 0 of `MEMSLOT_SET`'s flags: log dirty pages.
pub const FLAG_LOG: u64 = 1;
/// Bit 1 of `MEMSLOT_SET`'s flags: read-only.
pub const FLAG_READONLY: u64 = 2;
/// Bit 2 of `MEMSLOT_SET`'s flags: post-copy, no page mapped until the
/// host says it arrived (`PAGE_READY`).
pub const FLAG_POSTCOPY: u64 = 4;

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

/// EL2's slot records: the slot-changing and dirty-log commands hold
/// their lock from their checks to their record update (KVM's
/// `slots_lock`), so no two of them interleave.
pub(crate) type Slots = [Option<SlotRecord>; MAX_SLOTS];

/// Slot `id`'s index and record: [`HypError::SlotOutOfRange`],
/// [`HypError::NoSuchSlot`].
pub(crate) fn slot_arg(slots: &Slots, id: u64) -> Result<(u16, SlotRecord), HypError> {
    let i = usize::try_from(id)
        .ok()
        .filter(|&i| i < MAX_SLOTS)
        .ok_or(HypError::SlotOutOfRange)?;
    let rec = slots[i].ok_or(HypError::NoSuchSlot)?;
    Ok((i as u16, rec))
}

pub(crate) struct Vm {
    pub(crate) mmu: El2Mmu,
    /// Each vCPU's engine state, taken by its CPU's abort handler.
    pub(crate) vcpus: Vec<lock_api::Mutex<RawMutex, VcpuMmu<PoolMmOps>>>,
    pub(crate) mode: LogMode,
    pub(crate) ring_entries: u64,
    pub(crate) slots: lock_api::Mutex<RawMutex, Slots>,
    /// Post-copy slots' received pages, a bit each (`hyp_postcopy.rs`).
    pub(crate) received: lock_api::Mutex<RawMutex, [Option<Vec<u64>>; MAX_SLOTS]>,
    /// Where slots' backing pages are (`hyp_remap.rs`).
    pub(crate) host: Arc<El2Host>,
    /// The throttle and pace the host set (`pace/mod.rs`).
    pub(crate) brakes: lock_api::Mutex<RawMutex, Brakes>,
    /// Each vCPU's brake state, taken by its CPU's abort handler.
    pub(crate) vcpu_brakes: Vec<lock_api::Mutex<RawMutex, VcpuBrake>>,
}

/// Counters kept by EL2 itself (the engine keeps the rest).
#[derive(Default)]
pub(crate) struct HypCounters {
    handled: AtomicU64,
    refused: AtomicU64,
    to_host: AtomicU64,
    commands_ok: AtomicU64,
    commands_refused: AtomicU64,
    pub(crate) paced_exits: AtomicU64,
    pub(crate) paced_pages: AtomicU64,
    pub(crate) throttle_ns: AtomicU64,
    pub(crate) pace_ns: AtomicU64,
}

/// EL2's state: the machine's layout, the carve-out's table pool, the TLB
/// backend, the VM (once created) and the counters.
///
/// Every method takes `&self`: each CPU answers its own vCPU's aborts
/// concurrently (the VM's lock shared, the vCPU's own lock), while
/// commands serialise on the slot records and only `VM_INIT` and
/// `VM_DESTROY` take the VM's lock exclusively.
pub struct Hyp {
    pub(crate) layout: Layout,
    pool: Arc<PagePool>,
    tlb: Arc<dyn TlbInvalidate>,
    pub(crate) vm: lock_api::RwLock<RawRwLock, Option<Vm>>,
    pub(crate) counters: HypCounters,
    /// The brakes' clock, in nanoseconds (`None`: no clock).
    clock: fn() -> Option<u64>,
}

// SAFETY: the only fields that are neither Send nor Sync are the shared
// area's and RAM's addresses in `layout`, which `Hyp::new`'s caller
// vouches for;
// everything it points to is reached only through volatile word accesses
// (the host may change it at any time anyway), and the rest is behind
// locks or atomics.
unsafe impl Send for Hyp {}
// SAFETY: as for `Send`.
unsafe impl Sync for Hyp {}

pub(crate) fn engine_error(e: Error) -> HypError {
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
    /// `layout.ram_va` likewise reaches `layout.ram.size` bytes (guest
    /// memory: EL2 copies whole pages in it only for `REMAP_PAGE`);
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
            vm: lock_api::RwLock::new(None),
            counters: HypCounters::default(),
            clock: crate::pace::now_ns,
        })
    }

    /// The same EL2 with `clock` as the brakes' clock (nanoseconds, `None`
    /// where there is none) instead of the physical counter
    /// ([`crate::pace::now_ns`]): a host's tests give it a fixed one.
    #[must_use]
    pub fn with_clock(mut self, clock: fn() -> Option<u64>) -> Self {
        self.clock = clock;
        self
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// EL2's record of slot `id`, if it exists.
    pub fn slot(&self, id: usize) -> Option<SlotRecord> {
        let vm = self.vm.read();
        vm.as_ref()
            .and_then(|v| v.slots.lock().get(id).copied().flatten())
    }

    /// Runs `f` on the VM's engine, if a VM exists (inspection, tests).
    pub fn with_mmu<R>(&self, f: impl FnOnce(&El2Mmu) -> R) -> Option<R> {
        self.vm.read().as_ref().map(|v| f(&v.mmu))
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        let n = &self.counters;
        let mut c = Counters {
            aborts_handled: n.handled.load(Ordering::Relaxed),
            aborts_refused: n.refused.load(Ordering::Relaxed),
            aborts_to_host: n.to_host.load(Ordering::Relaxed),
            commands_ok: n.commands_ok.load(Ordering::Relaxed),
            commands_refused: n.commands_refused.load(Ordering::Relaxed),
            table_pages: self.pool.used_pages() as u64,
            paced_exits: n.paced_exits.load(Ordering::Relaxed),
            paced_pages: n.paced_pages.load(Ordering::Relaxed),
            throttle_ns: n.throttle_ns.load(Ordering::Relaxed),
            pace_ns: n.pace_ns.load(Ordering::Relaxed),
            ..Counters::default()
        };
        if let Some(vm) = self.vm.read().as_ref() {
            for v in &vm.vcpus {
                let st = v.lock().stats;
                c.translation += st.translation;
                c.permission += st.permission;
                c.dirtied += st.dirtied;
            }
            c.collapsed = vm.mmu.vm_stats().collapsed;
        }
        c
    }

    /// Answers a command block: checks, acts, and writes `status` and
    /// `ret` (zeroed on error, the state unchanged).
    pub fn dispatch(&self, cmd: &mut Command) {
        let r = match Op::from_code(cmd.op) {
            Some(op) => self.call(op, &cmd.args),
            None => Err(HypError::UnknownOp),
        };
        match r {
            Ok(ret) => {
                cmd.status = 0;
                cmd.ret = ret;
                self.counters.commands_ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                cmd.status = e.status();
                cmd.ret = [0; 4];
                self.counters
                    .commands_refused
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs `op` with `args` (the dispatcher without the block).
    ///
    /// # Errors
    /// The first check the arguments fail, or the engine's refusal.
    pub fn call(&self, op: Op, args: &[u64; 6]) -> Result<[u64; 4], HypError> {
        let one = |v: u64| [v, 0, 0, 0];
        match op {
            Op::VmInit => return self.vm_init(args).map(one),
            Op::VmDestroy => return self.vm_destroy().map(|()| [0; 4]),
            Op::Counters => return self.write_counters(args).map(|()| [0; 4]),
            _ => {}
        }
        let guard = self.vm.read();
        let vm = guard.as_ref().ok_or(HypError::NoVm)?;
        match op {
            Op::MemslotSet => self.memslot_set(vm, args).map(|()| [0; 4]),
            Op::LogSet => self.log_set(vm, args).map(|()| [0; 4]),
            Op::GetDirty => self.get_dirty(vm, args).map(one),
            Op::ClearDirty => self.clear_dirty(vm, args).map(one),
            Op::RingHarvest => self.ring_harvest(vm, args).map(one),
            Op::RingReset => self.ring_reset(vm).map(one),
            Op::UnmapRange => self.unmap_range(vm, args).map(one),
            Op::Collapse => self.collapse(vm, args).map(one),
            Op::PageReady => self.page_ready(vm, args).map(one),
            Op::RemapPage => self.remap_page(vm, args),
            Op::MemslotDeleteLogged => self.memslot_delete_logged(vm, args).map(one),
            Op::Pace => self.pace(vm, args).map(|()| [0; 4]),
            Op::VmInit | Op::VmDestroy | Op::Counters => Err(HypError::UnknownOp),
        }
    }

    /// `VM_INIT`: mode, ring entries (ring only: a power of two,
    /// 256..=65536; else 0), vCPUs (1..=[`MAX_VCPUS`]).
    fn vm_init(&self, args: &[u64; 6]) -> Result<u64, HypError> {
        let mut slot = self.vm.write();
        if slot.is_some() {
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
            LogMode::WpGet => DirtyMode::Bitmap {
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
        let host = Arc::new(El2Host::default());
        let mmu = Mmu::for_platform(fmt, mm, self.tlb.clone(), slots, policy)
            .map_err(engine_error)?
            .with_host_memory(host.clone());
        let vcpus = (0..args[2])
            .map(|_| mmu.new_vcpu().map(lock_api::Mutex::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(engine_error)?;
        let root = mmu.with_table(|pt| pt.root_pa());
        let vcpu_brakes = vcpus.iter().map(|_| Default::default()).collect();
        *slot = Some(Vm {
            mmu,
            vcpus,
            mode,
            ring_entries: entries,
            slots: lock_api::Mutex::new([None; MAX_SLOTS]),
            received: lock_api::Mutex::new(core::array::from_fn(|_| None)),
            host,
            brakes: Default::default(),
            vcpu_brakes,
        });
        Ok(root)
    }

    /// `VM_DESTROY`: the VM's tables go back to the pool, then the VMID's
    /// TLB entries are flushed before any page can be reused. The host
    /// stops every vCPU of the VM first.
    fn vm_destroy(&self) -> Result<(), HypError> {
        let mut slot = self.vm.write();
        slot.take().ok_or(HypError::NoVm)?;
        self.tlb.flush_vmid();
        Ok(())
    }

    /// Answers vCPU `vcpu`'s stage-2 abort with the engine: a first touch
    /// maps from the slot's backing, a write-protection fault under
    /// logging marks the page dirty; an IPA no slot covers is refused
    /// (never mapped), and so is one in the carve-out, which no slot can
    /// cover; a vCPU whose dirty ring is soft-full exits to the host
    /// ([`AbortOutcome::RingFull`]), its abort not handled.
    pub fn handle_abort(&self, vcpu: usize, abort: &Stage2Abort) -> AbortOutcome {
        let out = self.abort_outcome(vcpu, abort);
        let c = &self.counters;
        let n = match out {
            AbortOutcome::Handled { .. } | AbortOutcome::Paced { .. } => &c.handled,
            AbortOutcome::Refused(_) => &c.refused,
            AbortOutcome::RingFull | AbortOutcome::PageMissing { .. } | AbortOutcome::ToHost => {
                &c.to_host
            }
        };
        n.fetch_add(1, Ordering::Relaxed);
        out
    }

    fn abort_outcome(&self, vcpu: usize, abort: &Stage2Abort) -> AbortOutcome {
        let Some(kind) = abort.kind() else {
            return AbortOutcome::Refused(Refusal::NotStage2);
        };
        let ipa = abort.ipa();
        let carve = self.layout.carve_out.overlaps(ipa, 1);
        let guard = self.vm.read();
        let Some(vm) = guard.as_ref() else {
            return AbortOutcome::ToHost;
        };
        let Some(v) = vm.vcpus.get(vcpu) else {
            return AbortOutcome::ToHost;
        };
        let permission = matches!(kind, s2mmu::mmu::FaultKind::Permission { .. });
        if !permission && vm.page_missing(ipa) {
            return AbortOutcome::PageMissing {
                ipa: ipa & !(crate::check::PAGE - 1),
            };
        }
        let mut v = v.lock();
        let dirtied = v.stats.dirtied;
        match vm
            .mmu
            .handle_stage2_fault(&mut v, Gpa::new(ipa), abort.is_write(), kind)
        {
            Ok(FaultOutcome::Fast | FaultOutcome::Slow | FaultOutcome::Spurious)
            | Ok(FaultOutcome::Retry) => {
                let pages = v.stats.dirtied.saturating_sub(dirtied);
                drop(v);
                self.brake(vm, vcpu, pages, permission)
            }
            Err(Error::NoSlot { .. }) if carve => AbortOutcome::Refused(Refusal::CarveOut),
            Err(Error::NoSlot { .. }) => AbortOutcome::Refused(Refusal::NoSlot),
            Err(Error::WriteToReadOnly { .. }) => AbortOutcome::Refused(Refusal::ReadOnly),
            Err(Error::RingFull { .. }) => AbortOutcome::RingFull,
            Err(_) => AbortOutcome::ToHost,
        }
    }
}

/// The `PACE` command and the brakes in the abort path ([`crate::pace`]).
impl Hyp {
    /// `PACE`: throttle ns per page dirtied, pace pages a second per vCPU
    /// ([`Brakes::from_args`]; a nonzero pace without a clock,
    /// [`HypError::NoClock`]). Each vCPU's next dirtying fault works under
    /// the new brakes; a new pace restarts each vCPU's pace clock.
    pub(crate) fn pace(&self, vm: &Vm, args: &[u64; 6]) -> Result<(), HypError> {
        let b = Brakes::from_args(args)?;
        if b.pace != 0 && (self.clock)().is_none() {
            return Err(HypError::NoClock);
        }
        // Set first, then each clock restarted under its vCPU's lock (which
        // `brake` holds while it reads the brakes): a fault after the
        // restart works under the new pace from a fresh clock.
        let old = core::mem::replace(&mut *vm.brakes.lock(), b);
        if old.pace != b.pace {
            for v in &vm.vcpu_brakes {
                v.lock().restart_pace();
            }
        }
        Ok(())
    }

    /// vCPU `vcpu`'s abort was answered, dirtying `pages` pages: what the
    /// guest does next, [`AbortOutcome::Handled`] or, when a wait is due,
    /// [`AbortOutcome::Paced`] (counted).
    pub(crate) fn brake(&self, vm: &Vm, vcpu: usize, pages: u64, permission: bool) -> AbortOutcome {
        let handled = AbortOutcome::Handled { permission };
        if pages == 0 {
            return handled;
        }
        let Some(v) = vm.vcpu_brakes.get(vcpu) else {
            return handled;
        };
        let mut v = v.lock();
        let b = *vm.brakes.lock();
        if !b.on() {
            return handled;
        }
        // A pace is only set with a clock (`pace`); the throttle needs none.
        let now = if b.pace == 0 {
            0
        } else {
            (self.clock)().unwrap_or(0)
        };
        let (w, ahead) = v.on_dirty(b, pages, now);
        drop(v);
        let c = &self.counters;
        if ahead {
            c.paced_pages.fetch_add(pages, Ordering::Relaxed);
        }
        if !w.any() {
            return handled;
        }
        c.paced_exits.fetch_add(1, Ordering::Relaxed);
        c.throttle_ns.fetch_add(w.throttle_ns, Ordering::Relaxed);
        c.pace_ns.fetch_add(w.pace_ns, Ordering::Relaxed);
        AbortOutcome::Paced {
            throttle_ns: w.throttle_ns,
            pace_ns: w.pace_ns,
        }
    }
}
