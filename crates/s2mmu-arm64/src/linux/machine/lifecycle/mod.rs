//! A Linux VM's one lifecycle: made blank (a QEMU machine, the engine in
//! its placement, RAM; no vCPU runs), then loaded (kernel, initramfs,
//! device tree and the boot vCPU's registers: `load/`), or given a saved
//! state (`migrate/`), then started (the vCPU threads and the devices
//! around them: [`start`]). A boot is load plus start
//! ([`LinuxVm::boot`]); a migration's destination is blank plus restore
//! plus start ([`LinuxVm::blank`], [`LinuxVm::load_guest_state`]);
//! `s2mmu linux`'s run boots one and watches it until it stops
//! ([`crate::linux::vm::run`]).

use crate::layout;
use crate::linux::dirty_limit::DirtyLimit;
use crate::linux::fdt::FdtConfig;
use crate::linux::memory::LinuxRam;
use crate::linux::page_fetch::PageFetch;
use crate::linux::placement::Placement;
use crate::linux::set::DeviceLayout;
use crate::linux::shared::{Shared, StopReason, RAM_IPA};
use crate::linux::uart::{ConsoleBuffer, Uart};
use crate::linux::vcpu_state::CMD_STATE;
use crate::machine::{Machine, RamBacking};
use crate::Result;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

mod clock;
pub(in crate::linux) mod config;
mod counter;
mod engine;
mod load_guest;
pub(in crate::linux) mod spec;
pub(in crate::linux) mod start;
pub(in crate::linux) mod vcpu_thread;

pub use clock::RestoreClock;
use config::LinuxConfig;
use spec::EngineSpec;
use vcpu_thread::Ctl;

/// How long a blank VM's idle CPUs wait at a time once backed off
/// ([`crate::machine::Mailbox::park`]) until its state comes: 200 timer
/// wake-ups a second per CPU instead of 1,560 at the usual 640 µs cap.
/// [`LinuxVm::unpark_cpus`] ends the wait in progress at once (a kick
/// for the vCPUs' CPUs, the host's bell for the service CPU), so none of
/// it lands in a migration's downtime.
pub const BLANK_PARK: Duration = Duration::from_millis(5);

/// Reads of a blank machine's counter for its anchor (the one with the
/// shortest round trip is kept).
const ANCHOR_READS: usize = 3;

/// The running parts: shared with the vCPU threads.
pub(in crate::linux) struct Running {
    pub(in crate::linux) sh: Arc<Shared>,
    pub(in crate::linux) uart: Arc<Uart>,
    pub(in crate::linux) ctl: Arc<Ctl>,
    threads: Vec<JoinHandle<Result<()>>>,
}

/// A Linux VM on its own QEMU machine, which can be paused, saved,
/// restored and migrated.
pub struct LinuxVm {
    pub(in crate::linux) machine: Arc<Machine>,
    pub(in crate::linux) vcpus: usize,
    pub(in crate::linux) mem: u64,
    pub(in crate::linux) console: ConsoleBuffer,
    echo: bool,
    timeout: Duration,
    pub(in crate::linux) layout: DeviceLayout,
    /// The engine's VM while no vCPU thread holds it.
    pub(in crate::linux) idle: Option<Box<dyn Placement>>,
    /// How the engine of every QEMU this VM starts is made.
    pub(in crate::linux) spec: EngineSpec,
    pub(in crate::linux) run: Option<Running>,
    pub(in crate::linux) paused: bool,
    /// The guest's virtual count at the last pause.
    pub(in crate::linux) paused_vct: u64,
    /// Whether this QEMU has run guest code (see [`LinuxVm::renew`]).
    pub(in crate::linux) ran: bool,
    /// Guest RAM as one mapping (the current machine's).
    pub(in crate::linux) ram: LinuxRam,
    /// While this QEMU has not run and a state is to come: the hash of
    /// each page as it is (read from the fresh RAM, then of each page
    /// written).
    pub(in crate::linux) written: Option<Vec<u64>>,
    /// Post-copy's hook, given to the vCPU threads.
    pub(in crate::linux) hook: Option<Arc<dyn PageFetch>>,
    /// Throttle and pace, given to the vCPU threads of every QEMU.
    pub(in crate::linux) limit: Arc<DirtyLimit>,
    /// The last restore's clock.
    pub(in crate::linux) restore_clock: RestoreClock,
    /// A blank VM's counter, read when it was made: its restore places
    /// the guest's count from it without a command, and the first
    /// instruction's stamp is placed on the host's clock by it.
    pub(in crate::linux) counter_anchor: Option<counter::CounterAnchor>,
    /// The first guest instruction after the last resume, on the host's
    /// clock ([`LinuxVm::first_instruction_at`]).
    pub(in crate::linux) first_instruction_at: Option<std::time::Instant>,
}

impl LinuxVm {
    /// A VM of `cfg.vcpus` vCPUs and `cfg.mem` bytes on a new QEMU that
    /// has not run (a migration's or a snapshot's destination). Its RAM is
    /// mapped in 4 KiB pages, so that a post-copy destination maps no page
    /// that has not arrived ([`LinuxVm::set_page_fetch`]).
    ///
    /// # Errors
    /// As [`crate::linux::vm::run`] before the guest starts.
    pub fn blank(cfg: &LinuxConfig) -> Result<LinuxVm> {
        let spec = EngineSpec::migratable(
            cfg.engine,
            cfg.ram_pages,
            crate::linux::memory::PAGE as u64,
            cfg.dirty.mode,
        );
        let mut vm = LinuxVm::new_blank(cfg, spec)?;
        vm.written = Some(vm.ram.fresh_hashes()?);
        // Read now, outside any downtime (see `counter_now`): the read of
        // the shortest round trip of three, which bounds how late a stamp
        // the anchor maps to the host's clock can be placed.
        let mut best: Option<(u64, std::time::Instant, std::time::Instant)> = None;
        for _ in 0..ANCHOR_READS {
            let posted = std::time::Instant::now();
            let count = vm.counter()?;
            let at = std::time::Instant::now();
            if best.is_none_or(|(_, p, a)| at - posted < a - p) {
                best = Some((count, posted, at));
            }
        }
        if let Some((count, posted, at)) = best {
            vm.anchor_counter(count, posted, at);
        }
        // Nothing runs here until a state is loaded: the CPUs park (their
        // timer waits cost QEMU's threads CPU that a migration's stream
        // into this machine needs) until `unpark_cpus`. Not in
        // `new_blank`: a boot starts from it and its CPUs serve the
        // running guest's harvests and pauses.
        for cpu in 0..vm.machine.cpus() {
            vm.machine.mailbox(cpu).park(BLANK_PARK)?;
        }
        Ok(vm)
    }

    /// Boots `cfg`'s kernel and initramfs on a new QEMU (blank, loaded,
    /// started); the guest runs when this returns.
    ///
    /// # Errors
    /// As [`crate::linux::vm::run`].
    pub fn boot(cfg: &LinuxConfig) -> Result<LinuxVm> {
        let spec = EngineSpec::migratable(cfg.engine, cfg.ram_pages, 2 << 20, cfg.dirty.mode);
        let mut me = LinuxVm::new_blank(cfg, spec)?;
        // This process's mapping of guest RAM filled in before the guest
        // runs: a migration's or a snapshot's round 0 reads every page of
        // it, and would otherwise take a first-touch fault on each one
        // (round 0's reads cost 12 times as much a page without this).
        // Nothing is lost where the kernel cannot (before Linux 5.14).
        let _ = me.ram.populate_for_writes();
        me.load_and_start(cfg)?;
        Ok(me)
    }

    /// A VM on a new QEMU whose engine `spec` makes, with no vCPU
    /// thread.
    ///
    /// # Errors
    /// A bad `cfg`; as [`LinuxVm::start_engine`].
    pub(in crate::linux) fn new_blank(cfg: &LinuxConfig, spec: EngineSpec) -> Result<LinuxVm> {
        config::check(cfg)?;
        let (machine, avm) = LinuxVm::start_engine(cfg.vcpus, cfg.mem, &spec)?;
        let ram = LinuxRam::new(machine.ram().clone(), layout::DATA, cfg.mem, RAM_IPA)?;
        // The brakes go to the engine now, with the machine, not at the
        // start (a migration's destination starts inside the downtime).
        let limit = Arc::new(DirtyLimit::new(cfg.vcpus));
        limit.attach(&*avm);
        Ok(LinuxVm {
            machine,
            vcpus: cfg.vcpus,
            mem: cfg.mem,
            console: ConsoleBuffer::new(4 << 20),
            echo: cfg.echo,
            timeout: cfg.timeout,
            layout: device_layout(cfg.mem, cfg.vcpus),
            idle: Some(avm),
            spec,
            run: None,
            paused: true,
            paused_vct: 0,
            ran: false,
            ram,
            written: None,
            hook: None,
            limit,
            restore_clock: RestoreClock::default(),
            counter_anchor: None,
            first_instruction_at: None,
        })
    }

    /// The throttle and pace of the guest's vCPUs (auto-converge and the
    /// dirty limit: see [`DirtyLimit`]), and what they did.
    pub fn dirty_limit(&self) -> &Arc<DirtyLimit> {
        &self.limit
    }

    /// What the console printed (the last 4 MiB).
    pub fn console(&self) -> &ConsoleBuffer {
        &self.console
    }

    /// Which host pages back the current machine's RAM.
    pub fn ram_backing(&self) -> &RamBacking {
        self.machine.ram_backing()
    }

    /// Exits the stub answered on every vCPU so far (grows while the
    /// guest runs; still after a pause).
    pub fn stub_exits(&self) -> u64 {
        (0..self.vcpus)
            .map(|v| self.machine.mailbox(v).exit_stats().0)
            .sum()
    }

    /// Why the guest stopped, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        let r = self.run.as_ref()?;
        r.sh.stopping()
            .then(|| r.sh.cpus.stop_reason().unwrap_or(StopReason::PowerOff))
    }

    /// The physical counter of this machine now (the service CPU reads
    /// it).
    pub(in crate::linux) fn counter(&self) -> Result<u64> {
        // Rung: a blank machine's service CPU may be parked.
        self.machine
            .mailbox(self.vcpus)
            .command_ringing(CMD_STATE, &[0, 0, 0, 0])
    }

    /// Anchors the machine's counter ([`counter::CounterAnchor`]) at
    /// `count`, read by a command posted at `posted` whose answer was seen
    /// at `at`; the round trip is how late the anchor may place a stamp.
    pub(in crate::linux) fn anchor_counter(
        &mut self,
        count: u64,
        posted: std::time::Instant,
        at: std::time::Instant,
    ) {
        let hz = self.machine.mailbox(self.vcpus).read(layout::mb::CNTFRQ);
        self.counter_anchor = counter::CounterAnchor::new(count, at, hz);
        self.restore_clock.anchor_round_trip = at - posted;
    }

    /// The physical counter now: carried forward from the blank VM's read
    /// where there was one (no command; at most the read's round trip
    /// below the machine's count), else read by the service CPU.
    pub(in crate::linux) fn counter_now(&self) -> Result<u64> {
        match self.counter_anchor {
            Some(a) => Ok(a.count_at(std::time::Instant::now())),
            None => self.counter(),
        }
    }

    /// Stops the guest (if it runs) and its threads.
    ///
    /// # Errors
    /// The first error a vCPU thread met.
    pub fn shut_down(&mut self) -> Result<()> {
        self.take_down()
    }

    /// The QEMU machine the VM runs on now (a VM that takes a guest back
    /// starts a new one at its first write).
    pub fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// Whether the vCPUs are paused (or have never run).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// vCPUs.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus
    }
}

impl Drop for LinuxVm {
    fn drop(&mut self) {
        let _ = self.take_down();
    }
}

/// Where the virt machine's devices sit for `mem` bytes of RAM and
/// `vcpus` vCPUs (the device tree's places).
fn device_layout(mem: u64, vcpus: usize) -> DeviceLayout {
    let f = FdtConfig::virt(mem, vcpus as u32, "");
    DeviceLayout {
        gicd: f.gicd.0,
        gicr: f.gicr.0,
        uart: f.uart.0,
        uart_spi: f.uart.2,
    }
}
