//! The migratable Linux VM ([`LinuxVm`]) behind the migration library's
//! session interface: [`SessionVm`] (its RAM as one mapping, the engine's
//! dirty log of its one RAM slot), [`GuestRun`] (pause and resume) and
//! [`SourceGuest`] (the header's shape, the STATE body: the versioned,
//! checksummed Linux state of `vm_state`). The destination side is
//! `session_dest`.

use crate::ram::LinuxGuestRam;
use s2mmu::format::FormatId;
use s2mmu_arm64::linux::dirty_limit::{DirtyLimit, DirtyLimitCounters};
use s2mmu_arm64::linux::migrate::EngineLog;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm;
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::session::postcopy::Final;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, PageFetch, RamSlot, SessionVm, VmError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a source's service CPU waits at a time while its guest's log
/// runs and nothing needs it ([`LinuxSessionVm::park_service_while_logging`]):
/// 200 QEMU timer wake-ups a second instead of 1,560 at the 640 µs cap,
/// the most frequent wake-up of the source's QEMU in round 0.
pub(crate) const LOGGING_PARK: Duration = Duration::from_millis(5);

/// The backing name a Linux guest's header carries: its RAM is the file
/// QEMU uses as its memory, shared with this process. A destination of
/// another kind refuses it by name.
pub const LINUX_BACKING: &str = "qemu-shared";

/// A [`LinuxVm`] as the session sees it. Pause, resume and state go
/// through the VM (behind a lock); the dirty log goes straight to the
/// engine's MMU and the pages straight through the RAM mapping, so the
/// sending threads never wait for the lock.
pub struct LinuxSessionVm {
    vm: Mutex<LinuxVm>,
    ram: Arc<LinuxGuestRam>,
    log: EngineLog,
    /// The log is on (a post-copy slot at EL2 is made again with it).
    logging: AtomicBool,
    slots: [RamSlot; 1],
    vcpus: usize,
    limit: Arc<DirtyLimit>,
    /// The log is hardware dirty state: the guest's writes fault nowhere,
    /// so auto-converge throttles by a share of time.
    hardware: bool,
    /// A post-copy destination: its dirty log stays on from the resume
    /// until FINAL, which reports the pages its guest wrote
    /// ([`LinuxSessionVm::take_written`]).
    tracking: AtomicBool,
    /// The service CPU is parked for [`LOGGING_PARK`].
    service_parked: AtomicBool,
    /// The RAM slot is a post-copy slot at EL2 already (made so at the
    /// SYNC that announced the switch, `SessionVm::prepare_postcopy`).
    postcopy_armed: AtomicBool,
}

fn vmerr(e: impl std::fmt::Display) -> VmError {
    VmError::new(e.to_string())
}

impl LinuxSessionVm {
    /// `vm` (booted, or blank for a destination) behind the interface.
    pub fn new(vm: LinuxVm) -> LinuxSessionVm {
        let ram = Arc::new(LinuxGuestRam::new(vm.ram().clone()));
        let log = vm.engine_log();
        let slots = [RamSlot {
            id: vm::RAM_SLOT,
            gpa: ram.gpa(),
            size: ram.size(),
            mem_offset: 0,
        }];
        let vcpus = vm.vcpu_count();
        let limit = vm.dirty_limit().clone();
        let hardware = vm.hardware_dirty();
        LinuxSessionVm {
            vm: Mutex::new(vm),
            ram,
            log,
            logging: AtomicBool::new(false),
            slots,
            vcpus,
            limit,
            hardware,
            tracking: AtomicBool::new(false),
            service_parked: AtomicBool::new(false),
            postcopy_armed: AtomicBool::new(false),
        }
    }

    /// A post-copy destination's written pages since its resume (bit `i`:
    /// page `i`), taken from the dirty log, which is then turned off. The
    /// guest must be paused.
    ///
    /// # Errors
    /// Not a post-copy destination, or the engine's log failed.
    pub(crate) fn take_written(&self) -> Result<Vec<u64>, VmError> {
        if !self.tracking.swap(false, Ordering::SeqCst) {
            return Err(VmError::new("no post-copy ran into this guest"));
        }
        let mut bm = Vec::new();
        bm.try_reserve_exact(self.ram.pages().div_ceil(64) as usize)
            .map_err(|e| VmError::new(format!("written-pages bitmap: {e}")))?;
        bm.resize(self.ram.pages().div_ceil(64) as usize, 0u64);
        self.get_dirty_log(vm::RAM_SLOT, &mut bm)?;
        self.log.disable(vm::RAM_SLOT).map_err(vmerr)?;
        self.logging.store(false, Ordering::SeqCst);
        Ok(bm)
    }

    /// Makes the RAM slot a post-copy slot at EL2 (logging if the log is
    /// on), once: it then maps no page until the host says it is here (its
    /// first touch exits to the page-fetch hook, then `PAGE_READY`). Two
    /// EL2 commands through the service CPU.
    ///
    /// # Errors
    /// EL2's refusal.
    fn arm_postcopy(&self, vm: &LinuxVm) -> Result<(), VmError> {
        if self.postcopy_armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        vm.el2_postcopy(self.logging.load(Ordering::SeqCst))
            .map_err(vmerr)?;
        self.postcopy_armed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The VM (its console, its exits, its shut-down).
    pub fn lock(&self) -> MutexGuard<'_, LinuxVm> {
        self.vm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// vCPUs.
    pub fn vcpus(&self) -> usize {
        self.vcpus
    }

    /// The throttle and pace of the guest's vCPUs and what they did.
    pub fn dirty_limit(&self) -> &Arc<DirtyLimit> {
        &self.limit
    }

    /// A migration source's service CPU parks for [`LOGGING_PARK`] from
    /// the start of its log (round 0) until the first harvest, a pause or
    /// the log's end (`wake_service`), when the guest
    /// has one vCPU and the engine splits eagerly: then nothing but the
    /// harvest's invalidations and a pause's kick needs that CPU (with
    /// more vCPUs it carries their IPIs, with splits on fault their
    /// invalidations). Whether it parked.
    pub(crate) fn park_service_while_logging(&self) -> bool {
        if self.vcpus != 1 || !self.log.service_idle_while_logging() {
            return false;
        }
        let parked = self.lock().engine_sink().park_service(LOGGING_PARK).is_ok();
        self.service_parked.store(parked, Ordering::SeqCst);
        parked
    }

    /// Ends [`LinuxSessionVm::park_service_while_logging`]'s park, and waits
    /// (for up to [`LOGGING_PARK`]) until the service CPU has left its
    /// park's wait, so that a harvest's invalidations or a pause's kick
    /// after it do not wait for that.
    pub(crate) fn wake_service(&self) {
        if self.service_parked.swap(false, Ordering::SeqCst) {
            self.lock().engine_sink().wake_service();
        }
    }

    /// Stops every vCPU (a failure is reported and the vCPUs that did
    /// stop stay so).
    pub(crate) fn pause_vcpus(&self) {
        self.wake_service();
        if let Err(e) = self.lock().pause_vcpus() {
            eprintln!("linux guest: pause: {}", crate::state::vm_error(e));
        }
    }

    /// Runs the vCPUs again.
    pub(crate) fn resume_vcpus(&self) {
        if let Err(e) = self.lock().resume_vcpus() {
            eprintln!("linux guest: resume: {}", crate::state::vm_error(e));
        }
    }

    fn slot_ok(&self, slot: u16) -> Result<(), VmError> {
        if slot == vm::RAM_SLOT {
            Ok(())
        } else {
            Err(VmError::new(format!(
                "slot {slot}: a Linux guest has one RAM slot, {}",
                vm::RAM_SLOT
            )))
        }
    }
}

impl SessionVm for LinuxSessionVm {
    type Ram = LinuxGuestRam;

    fn ram(&self) -> &Arc<LinuxGuestRam> {
        &self.ram
    }

    fn slots(&self) -> &[RamSlot] {
        &self.slots
    }

    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        // The session stops the log whenever a migration ends, failed or
        // not: a log already on here is an error of its own.
        self.log.enable(vm::RAM_SLOT).map_err(vmerr)?;
        self.logging.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        self.wake_service();
        if self.tracking.load(Ordering::SeqCst) {
            // A post-copy destination once every page is here: the log
            // goes on until FINAL takes the guest's writes from it.
            return Ok(());
        }
        self.log.disable(vm::RAM_SLOT).map_err(vmerr)?;
        self.logging.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        self.slot_ok(slot)?;
        self.wake_service();
        // Without manual protect GET takes the bits and write-protects
        // their pages again in one step; with it (the engine's default
        // policy) GET only copies and CLEAR re-arms (clear_dirty_log).
        let mut taken = Vec::new();
        taken
            .try_reserve_exact(bitmap.len())
            .map_err(|e| VmError::new(format!("dirty bitmap: {e}")))?;
        taken.resize(bitmap.len(), 0u64);
        self.log.get(vm::RAM_SLOT, &mut taken).map_err(vmerr)?;
        for (w, t) in bitmap.iter_mut().zip(&taken) {
            *w |= *t;
        }
        Ok(())
    }

    fn clear_dirty_log(
        &self,
        slot: u16,
        first_page: u64,
        num_pages: u64,
        bitmap: &[u64],
    ) -> Result<(), VmError> {
        self.slot_ok(slot)?;
        if !self.log.manual_protect() {
            // GET re-armed the pages it reported already.
            return Ok(());
        }
        // Manual protect: the bits stay set and the pages writable until
        // cleared here (before the session reads them), so that a page
        // the guest writes again is logged again.
        self.log
            .clear(vm::RAM_SLOT, first_page, num_pages, bitmap)
            .map_err(vmerr)
    }

    fn prepare_postcopy(&self) -> Result<(), VmError> {
        let vm = self.lock();
        self.arm_postcopy(&vm)
    }

    fn set_page_fetch(&self, fetch: Option<Arc<dyn PageFetch>>) -> Result<(), VmError> {
        let mut vm = self.lock();
        if fetch.is_some() {
            self.arm_postcopy(&vm)?;
            // Set before the resume, with the log just turned on: from
            // here every page the guest writes is in the log.
            self.tracking.store(true, Ordering::SeqCst);
        }
        let machine = vm.machine().clone();
        vm.set_page_fetch(fetch.map(|f| crate::fault_hook::with_postcopy_fault(f, &machine)))
            .map_err(vmerr)
    }
}

/// A running Linux guest as the session's source: [`run_source`] over it
/// migrates it.
///
/// [`run_source`]: s2mmu_migrate::session::source::run_source
pub struct LinuxSource {
    vm: Arc<LinuxSessionVm>,
}

impl LinuxSource {
    /// The source of a migration of `vm`, which runs.
    pub fn new(vm: LinuxVm) -> LinuxSource {
        LinuxSource {
            vm: Arc::new(LinuxSessionVm::new(vm)),
        }
    }

    /// The source of a migration (or snapshot) of a guest the session
    /// holds already: one that came in by a migration
    /// (`LinuxDest::built`), to migrate it on.
    pub fn from_session_vm(vm: Arc<LinuxSessionVm>) -> LinuxSource {
        LinuxSource { vm }
    }
}

impl GuestRun for LinuxSource {
    fn pause(&self) {
        self.vm.pause_vcpus();
    }

    // The service CPU, parked while the log runs, serves the pause's
    // kick: waking it is a round trip through it, outside the downtime
    // here.
    fn prepare_pause(&self) {
        self.vm.wake_service();
    }

    fn resume(&self) {
        self.vm.resume_vcpus();
    }

    fn counters(&self) -> GuestCounters {
        guest_counters(&self.vm.limit)
    }

    // Both are served at the guest's stage-2 write faults (dirty_limit).
    // Under hardware dirty state the only such faults are first touches:
    // the throttle is the share of time below instead.
    fn set_throttle_ns(&self, ns: u64) {
        self.vm
            .limit
            .set_throttle_ns(if self.vm.hardware { 0 } else { ns });
    }

    // Under hardware dirty state no write faults: the throttle is a share
    // of each vCPU's time, served at its exits.
    fn set_throttle_pct(&self, pct: u32) {
        if self.vm.hardware || pct == 0 {
            self.vm.limit.set_throttle_pct(pct);
        }
    }

    fn pace(&self) -> u64 {
        self.vm.limit.pace()
    }

    fn set_pace(&self, pages_per_sec: u64) {
        self.vm.limit.set_pace(pages_per_sec);
    }
}

/// The guest's writes as the host sees them: its stage-2 write faults,
/// one per page dirtied while dirty logging is on (what the session's
/// auto-converge sizes its throttle by). Guest time is not known.
fn guest_counters(limit: &DirtyLimit) -> GuestCounters {
    GuestCounters {
        writes: limit.counters().write_faults,
        guest_ns: 0,
    }
}

impl LinuxSource {
    /// What the throttle and the pace did so far (write faults, ns slept,
    /// faults paced).
    pub fn limit_counters(&self) -> DirtyLimitCounters {
        self.vm.limit.counters()
    }
}

impl SourceGuest for LinuxSource {
    type Vm = LinuxSessionVm;
    type Hook = NoHook;

    fn vm(&self) -> &Arc<LinuxSessionVm> {
        &self.vm
    }

    fn shape(&self) -> GuestShape {
        GuestShape {
            mem_size: self.vm.ram.size(),
            slots: 1,
            vcpus: u32::try_from(self.vm.vcpus).unwrap_or(u32::MAX),
            backing: LINUX_BACKING.into(),
            format: FormatId::of::<s2mmu::format::arm64::Arm64Stage2>(),
        }
    }

    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        let limit = self.vm.limit.clone();
        Arc::new(move || guest_counters(&limit))
    }

    /// # Errors
    /// [`MigrateError::SourceGuestStopped`] when the guest powered off,
    /// reset or failed since it booted (its vCPUs are off: a destination
    /// could only refuse that state); [`MigrateError::Setup`] when the
    /// state cannot be read.
    fn state(&self, _pace: u64) -> Result<Vec<u8>, MigrateError> {
        let mut guest = self.vm.lock();
        if let Some(r) = guest.stopped() {
            return Err(MigrateError::SourceGuestStopped {
                why: match r {
                    vm::StopReason::PowerOff => {
                        "the Linux guest powered off (PSCI SYSTEM_OFF)".into()
                    }
                    vm::StopReason::Reset => "the Linux guest reset (PSCI SYSTEM_RESET)".into(),
                    vm::StopReason::CpusOff => {
                        "the Linux guest turned its last CPU off (PSCI CPU_OFF)".into()
                    }
                    vm::StopReason::Timeout => "the Linux guest's run time limit passed".into(),
                    vm::StopReason::Error(e) => format!("the Linux guest failed: {e}"),
                    vm::StopReason::Escape => {
                        "the operator stopped the Linux guest (Ctrl-A x)".into()
                    }
                },
            });
        }
        crate::state::save(&mut guest)
            .map_err(|e| MigrateError::Setup(format!("the Linux guest's state: {e}")))
    }

    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        // The session calls it right after it turned the log on.
        self.vm.park_service_while_logging();
        Ok(NoHook)
    }

    fn supports_postcopy(&self) -> bool {
        true
    }

    fn verify_final(&self, _state: &[u8], fin: &Final) -> Result<Vec<(u16, u64)>, MigrateError> {
        // The guest stays paused after the switch: its memory is the
        // frozen memory the check needs.
        crate::session_postcopy::verify_final(&self.vm.ram, self.vm.vcpus, fin)
    }
}
