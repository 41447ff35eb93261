//! A Linux VM that can be paused, saved, restored and migrated: the same
//! guest as [`crate::linux::vm::run`] (kernel, device tree, vGIC, UART, PSCI,
//! every RAM page through the engine's fault path), driven step by step:
//! [`LinuxVm::pause_vcpus`], [`LinuxVm::guest_state`],
//! [`LinuxVm::load_guest_state`], [`LinuxVm::resume_vcpus`]. The
//! `s2mmu-arm64-migrate` crate puts it behind the migration library's
//! session.
//!
//! A pause kicks every running vCPU; at its next exit the host answers
//! as usual but with ACT_SAVE, and the stub stores the vCPU's registers
//! (asm/state.S). Resume (on the same machine or another) starts each
//! vCPU with the STATE command from those registers. On a new machine
//! CNTVOFF_EL2 is set so that the guest's virtual count continues from
//! the value it had at the pause: the downtime is invisible to the
//! guest's clock.

use crate::layout;
use crate::linux::assets::LinuxAssets;
use crate::linux::boot;
use crate::linux::dirty_limit::DirtyLimit;
use crate::linux::fdt::FdtConfig;
use crate::linux::gic::{Gic, GICR_STRIDE};
use crate::linux::memory::LinuxRam;
use crate::linux::mig_vcpu::{self, Ctl};
use crate::linux::page_fetch::PageFetch;
use crate::linux::placement::{Engine, Host, Placement};
use crate::linux::power::VcpuControl;
use crate::linux::psci::PowerState;
use crate::linux::set::DeviceSet;
use crate::linux::shared::{HostLog, RamFaults};
use crate::linux::timer::{TimerState, VirtualTimer};
use crate::linux::uart::{ConsoleBuffer, IrqCallback, Uart, UartOutput};
use crate::linux::vcpu_state::{VcpuState, CMD_STATE};
use crate::linux::vm::{self, DeviceLayout, LinuxConfig, Power, Shared, SlotRam, StopReason};
use crate::linux::vm_state::{LinuxState, VcpuPart};
use crate::machine::{Machine, RamBacking, RamPages};
use crate::{Arm64Error, Result};
use s2mmu::mmu::DirtyMode;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vm_superio::serial::SerialState;

mod clock;
mod engine;
mod engine_log;
mod restore;
pub use clock::RestoreClock;
pub use engine_log::EngineLog;

/// How long a pause may take (a loaded 2-core host runs QEMU slowly).
const PAUSE_DEADLINE: Duration = Duration::from_secs(60);

/// How long a blank VM's idle CPUs wait at a time once backed off
/// ([`crate::machine::Mailbox::park`]) until its state comes: 200 timer
/// wake-ups a second per CPU instead of 1,560 at the usual 640 µs cap.
/// [`LinuxVm::unpark_cpus`] ends the wait in progress at once (a kick
/// for the vCPUs' CPUs, the host's bell for the service CPU), so none of
/// it lands in a migration's downtime.
pub const BLANK_PARK: Duration = Duration::from_millis(5);

/// The running parts: shared with the vCPU threads.
pub(in crate::linux) struct Running {
    pub(in crate::linux) sh: Arc<Shared>,
    uart: Arc<Uart>,
    ctl: Arc<Ctl>,
    threads: Vec<JoinHandle<Result<()>>>,
}

/// A migratable Linux VM on its own QEMU machine.
pub struct LinuxVm {
    pub(in crate::linux) machine: Arc<Machine>,
    vcpus: usize,
    mem: u64,
    console: ConsoleBuffer,
    echo: bool,
    timeout: Duration,
    layout: DeviceLayout,
    /// The engine's VM while no vCPU thread holds it.
    idle: Option<Host>,
    /// Where the engine runs.
    engine: Engine,
    /// The dirty mode asked for a migration's log (each machine it starts
    /// logs in the engine's mode for it: hardware, or write protection).
    log: Option<DirtyMode>,
    run: Option<Running>,
    pub(in crate::linux) paused: bool,
    /// The guest's virtual count at the last pause.
    paused_vct: u64,
    /// Whether this QEMU has run guest code (see [`LinuxVm::renew`]).
    pub(in crate::linux) ran: bool,
    /// Guest RAM as one mapping (the current machine's).
    pub(in crate::linux) ram: LinuxRam,
    /// While this QEMU has not run: the hash of each page as it is (read
    /// from the fresh RAM, then of each page written).
    pub(in crate::linux) written: Option<Vec<u64>>,
    /// The size of the pages the engine maps guest RAM with.
    granule: u64,
    /// Which host pages back the RAM of every QEMU this VM starts.
    ram_pages: RamPages,
    /// Post-copy's hook, given to the vCPU threads.
    pub(in crate::linux) hook: Option<Arc<dyn PageFetch>>,
    /// Throttle and pace, given to the vCPU threads of every QEMU.
    limit: Arc<DirtyLimit>,
    /// The last restore's clock.
    restore_clock: RestoreClock,
}

impl LinuxVm {
    /// A VM of `cfg.vcpus` vCPUs and `cfg.mem` bytes on a new QEMU that
    /// has not run (a migration's or a snapshot's destination). Its RAM is
    /// mapped in 4 KiB pages, so that a post-copy destination maps no page
    /// that has not arrived ([`LinuxVm::set_page_fetch`]).
    ///
    /// # Errors
    /// As [`vm::run`] before the guest starts.
    pub fn blank(cfg: &LinuxConfig) -> Result<LinuxVm> {
        let vm = LinuxVm::blank_with(cfg, crate::linux::memory::PAGE as u64)?;
        // Nothing runs here until a state is loaded: the CPUs park (their
        // timer waits cost QEMU's threads CPU that a migration's stream
        // into this machine needs) until `unpark_cpus`. Not in
        // `blank_with`: `boot` starts from it and its CPUs serve the
        // running guest's harvests and pauses.
        for cpu in 0..vm.machine.cpus() {
            vm.machine.mailbox(cpu).park(BLANK_PARK)?;
        }
        Ok(vm)
    }

    /// A blank VM whose RAM the engine maps with `granule`-byte pages
    /// where it can (4 KiB or 2 MiB).
    fn blank_with(cfg: &LinuxConfig, granule: u64) -> Result<LinuxVm> {
        vm::check(cfg)?;
        // No harvester of its own: `cfg.dirty.mode` picks the log a
        // migration's session drives.
        let log = cfg.dirty.mode;
        let (machine, avm) =
            LinuxVm::start_engine(cfg.vcpus, cfg.mem, cfg.ram_pages, cfg.engine, granule, log)?;
        let f = FdtConfig::virt(cfg.mem, cfg.vcpus as u32, "");
        let ram = LinuxRam::new(machine.ram().clone(), layout::DATA, cfg.mem, vm::RAM_IPA)?;
        let written = Some(ram.fresh_hashes()?);
        Ok(LinuxVm {
            machine,
            vcpus: cfg.vcpus,
            mem: cfg.mem,
            console: ConsoleBuffer::new(4 << 20),
            echo: cfg.echo,
            timeout: cfg.timeout,
            layout: DeviceLayout {
                gicd: f.gicd.0,
                gicr: f.gicr.0,
                uart: f.uart.0,
                uart_spi: f.uart.2,
            },
            idle: Some(avm),
            engine: cfg.engine,
            log,
            run: None,
            paused: true,
            paused_vct: 0,
            ran: false,
            ram,
            written,
            granule,
            ram_pages: cfg.ram_pages,
            hook: None,
            limit: Arc::new(DirtyLimit::new(cfg.vcpus)),
            restore_clock: RestoreClock::default(),
        })
    }

    /// Boots `cfg`'s kernel and initramfs on a new QEMU; the guest runs
    /// when this returns.
    ///
    /// # Errors
    /// As [`vm::run`].
    pub fn boot(cfg: &LinuxConfig) -> Result<LinuxVm> {
        let mut me = LinuxVm::blank_with(cfg, 2 << 20)?;
        let bootargs = format!(
            "console=ttyS0 earlycon=uart8250,mmio,{:#x} {}",
            me.layout.uart, cfg.cmdline
        );
        let mut ram = SlotRam {
            ram: me.machine.ram(),
            size: cfg.mem,
        };
        let mut f = FdtConfig::virt(cfg.mem, cfg.vcpus as u32, &bootargs);
        f.gicr.1 = GICR_STRIDE * cfg.vcpus as u64;
        let files = LinuxAssets {
            image: cfg.kernel.clone(),
            initramfs: cfg.initrd.clone(),
            kernel_version: String::new(),
        };
        let boot = boot::load_linux(&mut ram, &files, &f)
            .map_err(|e| Arm64Error::Config(format!("loading the kernel: {e}")))?;
        let mut power = Power {
            state: vec![PowerState::Off; cfg.vcpus],
            start: vec![None; cfg.vcpus],
        };
        power.state[0] = PowerState::OnPending;
        power.start[0] = Some((boot.entry, boot.dtb));
        let gic = Gic::new(cfg.vcpus);
        me.start_threads(
            gic,
            None,
            power,
            VirtualTimer::new(),
            vec![None; cfg.vcpus],
            false,
        )?;
        me.paused = false;
        me.ran = true;
        me.written = None;
        Ok(me)
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
    fn counter(&self) -> Result<u64> {
        // Rung: a blank machine's service CPU may be parked.
        self.machine
            .mailbox(self.vcpus)
            .command_ringing(CMD_STATE, &[0, 0, 0, 0])
    }

    /// Builds the shared VM state around the engine's VM and starts the
    /// vCPU threads (parked when `paused`, with `restore` to start from).
    fn start_threads(
        &mut self,
        gic: Gic,
        uart_state: Option<SerialState>,
        power: Power,
        timer: VirtualTimer,
        restore: Vec<Option<VcpuState>>,
        paused: bool,
    ) -> Result<()> {
        let avm = self.idle.take().expect("no vCPU threads run");
        self.limit.attach(&avm);
        let me: Arc<OnceLock<Weak<Shared>>> = Arc::new(OnceLock::new());
        let intid = 32 + self.layout.uart_spi;
        let m2 = me.clone();
        let irq: IrqCallback = Arc::new(move || {
            if let Some(sh) = m2.get().and_then(Weak::upgrade) {
                sh.raise(0, intid);
            }
        });
        let out = if self.echo {
            UartOutput::BufferAndStdout(self.console.clone())
        } else {
            UartOutput::Buffer(self.console.clone())
        };
        let uart = Arc::new(match uart_state {
            Some(s) => {
                Uart::from_state(&s, irq, out).map_err(|e| Arm64Error::Config(e.to_string()))?
            }
            None => Uart::new(irq, out),
        });
        let devices = DeviceSet::new(self.layout, gic, uart.clone(), timer)
            .map_err(|e| Arm64Error::Config(e.to_string()))?;
        let sh = Arc::new(Shared {
            vm: avm,
            devices,
            cpus: VcpuControl::new(power, Instant::now() + self.timeout),
            faults: RamFaults::new(self.limit.clone()),
            host_log: HostLog::new(self.vcpus),
        });
        sh.faults.page_fetch.set(self.hook_range());
        let _ = me.set(Arc::downgrade(&sh));
        crate::linux::shared::spawn_watchdog(&sh).map_err(Arm64Error::Io)?;
        let ctl = Arc::new(Ctl::new(self.vcpus, paused));
        ctl.lock().restore = restore;
        let threads = (0..self.vcpus)
            .map(|id| {
                let (sh, ctl) = (sh.clone(), ctl.clone());
                std::thread::Builder::new()
                    .name(format!("linux-mig-vcpu{id}"))
                    .spawn(move || mig_vcpu::vcpu_main(&sh, &ctl, id))
                    .map_err(|e| Arm64Error::Io(format!("vCPU thread: {e}")))
            })
            .collect::<Result<_>>()?;
        self.run = Some(Running {
            sh,
            uart,
            ctl,
            threads,
        });
        Ok(())
    }

    /// Stops the vCPU threads and takes the engine's VM back from them.
    fn take_down(&mut self) -> Result<()> {
        let Some(r) = self.run.take() else {
            return Ok(());
        };
        r.sh.stop(StopReason::PowerOff);
        let mut first = None;
        for t in r.threads {
            match t.join() {
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                }
                Err(_) => {
                    first.get_or_insert(Arm64Error::Guest("a vCPU thread panicked".into()));
                }
                Ok(Ok(())) => {}
            }
        }
        drop(r.uart);
        r.sh.cpus.watch.join();
        let sh = Arc::try_unwrap(r.sh)
            .map_err(|_| Arm64Error::Guest("the VM is still shared after its threads".into()))?;
        self.idle = Some(sh.vm);
        first.map_or(Ok(()), Err)
    }

    /// Stops the guest (if it runs) and its threads.
    ///
    /// # Errors
    /// The first error a vCPU thread met.
    pub fn shut_down(&mut self) -> Result<()> {
        self.take_down()
    }

    pub(in crate::linux) fn running(&self) -> Result<&Running> {
        self.run.as_ref().ok_or_else(|| {
            Arm64Error::Guest("the VM has no state yet (never booted or restored)".into())
        })
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

impl LinuxVm {
    /// Stops every vCPU at an instruction boundary (their registers
    /// saved); memory and state are then stable.
    ///
    /// # Errors
    /// The VM never ran, a vCPU did not stop in time, or the guest
    /// stopped with an error.
    pub fn pause_vcpus(&mut self) -> Result<()> {
        let r = self.running()?;
        if self.paused {
            return Ok(());
        }
        {
            let mut g = r.ctl.lock();
            r.ctl.set_pause(&mut g, true);
        }
        let sh = r.sh.clone();
        r.ctl
            .wait_parked(Instant::now() + PAUSE_DEADLINE, |running| {
                let on: Vec<usize> = running
                    .iter()
                    .copied()
                    .filter(|&v| sh.cpus.power(v) == PowerState::On)
                    .collect();
                // A kick that fails (QEMU gone) ends with the vCPU
                // threads, which stop with that error and park.
                if !on.is_empty() {
                    if let Err(e) = Placement::kick_all(&sh.vm, &on) {
                        eprintln!("linux guest: pause: kick {on:?}: {e}");
                    }
                }
            })
            .map_err(Arm64Error::Guest)?;
        if let Some(StopReason::Error(e)) = self.stopped() {
            return Err(Arm64Error::Guest(format!("the guest stopped: {e}")));
        }
        let saved = r
            .ctl
            .lock()
            .saved
            .iter()
            .flatten()
            .map(|s| s.cntvct)
            .collect::<Vec<_>>();
        let vct = r.sh.devices.timer.save(saved.into_iter()).vct;
        self.paused_vct = vct;
        self.paused = true;
        Ok(())
    }

    /// Runs the vCPUs again (after a pause, or for the first time after
    /// [`LinuxVm::load_guest_state`]); returns once the first one executes
    /// guest code.
    ///
    /// # Errors
    /// The VM has no state, a vCPU did not start, or QEMU died.
    pub fn resume_vcpus(&mut self) -> Result<()> {
        let r = self.running()?;
        if !self.paused {
            return Ok(());
        }
        let t0 = Instant::now();
        // The first resume after a load ends a restore; later ones are
        // not timed.
        let restoring = !self.ran;
        let mbox: Vec<_> = (0..self.vcpus).map(|v| self.machine.mailbox(v)).collect();
        let first = {
            let mut g = r.ctl.lock();
            for v in 0..self.vcpus {
                if let Some(s) = g.saved[v].take() {
                    g.restore[v] = Some(s);
                }
            }
            let first = (0..self.vcpus).find(|&v| g.restore[v].is_some());
            if let Some(v) = first {
                VcpuState::clear_entered(&mbox[v]);
            }
            r.ctl.set_pause(&mut g, false);
            first
        };
        self.paused = false;
        self.ran = true;
        self.written = None;
        // Returns at the first guest instruction: the stub marks its ERET.
        if let Some(v) = first {
            while VcpuState::entered_at(&mbox[v]) == 0 {
                if t0.elapsed() > PAUSE_DEADLINE {
                    return Err(Arm64Error::Guest(format!("vCPU {v} did not start")));
                }
                self.machine.check_alive()?;
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if restoring {
            self.restore_clock.first_instruction = t0.elapsed();
        }
        Ok(())
    }
}

impl LinuxVm {
    /// The vCPU and device state of the paused VM ([`LinuxState`]; the
    /// `s2mmu-arm64-migrate` crate encodes it as a migration's STATE body).
    ///
    /// # Errors
    /// The VM has no state or is not paused.
    pub fn guest_state(&mut self) -> Result<LinuxState> {
        let r = self.running()?;
        if !self.paused {
            return Err(Arm64Error::Guest(
                "the VM must be paused to save its state".into(),
            ));
        }
        let g = r.ctl.lock();
        let p = r.sh.cpus.power.lock().unwrap_or_else(|p| p.into_inner());
        let cpus = (0..self.vcpus)
            .map(|v| VcpuPart {
                power: p.state[v],
                start: p.start[v],
                regs: g.saved[v].clone(),
            })
            .collect();
        drop((g, p));
        Ok(LinuxState {
            vcpus: self.vcpus,
            mem: self.mem,
            vct: self.paused_vct,
            gic: crate::linux::vm_state::gic_copy(&r.sh.devices.gic),
            uart: r.uart.state(),
            cpus,
        })
    }

    /// Loads a state [`LinuxVm::guest_state`] made into this paused VM,
    /// which has not run guest code; it runs from it on
    /// [`LinuxVm::resume_vcpus`]. State of another VM size is refused
    /// (naming what is wrong) with the VM unchanged.
    ///
    /// # Errors
    /// A state for another VM size, a VM that is not paused or has run,
    /// or its vCPU threads not starting.
    pub fn load_guest_state(&mut self, st: LinuxState) -> Result<()> {
        if !self.paused {
            return Err(Arm64Error::Guest(
                "state is restored into a paused VM only".into(),
            ));
        }
        // Every check first: a refused state leaves the VM as it was.
        st.fits(self.vcpus, self.mem)?;
        if self.ran {
            return Err(Arm64Error::Guest(
                "this QEMU has run guest code: write the guest's memory first (it then \
                 starts a new QEMU, whose translated-code cache is empty)"
                    .into(),
            ));
        }
        self.unpark_cpus();
        self.take_down()?;
        let t0 = Instant::now();
        let now = self.counter()?;
        let t1 = Instant::now();
        let timer = VirtualTimer::restore(&TimerState { vct: st.vct }, now);
        let power = Power {
            state: st.cpus.iter().map(|c| c.power).collect(),
            start: st.cpus.iter().map(|c| c.start).collect(),
        };
        let restore = st.cpus.iter().map(|c| c.regs.clone()).collect();
        self.start_threads(st.gic, Some(st.uart), power, timer, restore, true)?;
        self.paused_vct = st.vct;
        self.restore_clock = RestoreClock {
            counter: t1 - t0,
            threads: t1.elapsed(),
            first_instruction: Duration::ZERO,
        };
        Ok(())
    }
}
