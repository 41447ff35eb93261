//! A Linux VM on the arm64 model: Debian's kernel at EL1 under the EL2
//! stub, every byte of its RAM mapped by the engine's fault path, its
//! interrupt controller, UART and PSCI on the host.

use crate::layout;
use crate::linux::assets::LinuxAssets;
use crate::linux::boot;
use crate::linux::dirty::{self, HarvestConfig, HarvestReport};
use crate::linux::fdt::FdtConfig;
use crate::linux::gic::{Gic, GICR_STRIDE};
use crate::linux::loader::{BootLayout, LoadTarget};
use crate::linux::psci::PowerState;
use crate::linux::uart::{ConsoleBuffer, Uart, UartOutput};
use crate::linux::vcpu;
use crate::machine::{Machine, MachineConfig, RamPages, SharedRam};
use crate::vm::{Arm64Vm, VmConfig};
use crate::{Arm64Error, Result};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::linux::devices::timer::CNTHCTL_LINUX;
use crate::linux::el2::{self as el2p, El2Vm};
pub use crate::linux::placement::Engine;
use crate::linux::placement::Host;
use crate::linux::power::VcpuControl;
use crate::linux::set::DeviceSet;
pub use crate::linux::shared::{DeviceLayout, StopReason, HCR_LINUX, RAM_IPA, RAM_SLOT};
pub(crate) use crate::linux::shared::{HostLog, Power, RamFaults, Shared};
use crate::linux::timer::VirtualTimer;
/// Most vCPUs.
pub const MAX_VCPUS: usize = 4;
/// Least guest RAM.
pub const MIN_MEM: u64 = 128 << 20;
/// Most guest RAM.
pub const MAX_MEM: u64 = 4 << 30;
/// The console line `/init` prints once every CPU it counts is online.
pub const INIT_LINE: &str = "s2mmu-init: cpus online ";

/// How to run a Linux guest.
#[derive(Clone)]
pub struct LinuxConfig {
    /// vCPUs, 1..=[`MAX_VCPUS`].
    pub vcpus: usize,
    /// Guest RAM bytes, [`MIN_MEM`]..=[`MAX_MEM`], a multiple of 2 MiB.
    pub mem: u64,
    /// The uncompressed arm64 `Image`.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// Kernel command line after the console settings.
    pub cmdline: String,
    /// Where the console goes besides the buffer the report reads.
    pub echo: bool,
    /// Longest the guest may run before the host stops it.
    pub timeout: Duration,
    /// Dirty logging once `/init` runs, checked against page hashes.
    pub dirty: HarvestConfig,
    /// Which host pages back the machine's RAM.
    pub ram_pages: RamPages,
    /// Where the stage-2 engine runs.
    pub engine: Engine,
}

/// Guest RAM as the loader writes it: the shared RAM behind the memslot.
pub(crate) struct SlotRam<'a> {
    pub(crate) ram: &'a SharedRam,
    pub(crate) size: u64,
}

impl LoadTarget for SlotRam<'_> {
    fn range(&self) -> (u64, u64) {
        (RAM_IPA, self.size)
    }
    fn write(&mut self, gpa: u64, data: &[u8]) {
        // The loader writes only inside `range`, which the RAM holds.
        let pa = layout::DATA + (gpa - RAM_IPA);
        self.ram
            .write_bytes(pa, data)
            .expect("guest RAM lies inside the machine's data region");
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct LinuxReport {
    /// Why it stopped.
    pub reason: StopReason,
    /// Seconds from QEMU's start to the init line (`None`: never seen).
    pub init_s: Option<f64>,
    /// Seconds from QEMU's start to the stop.
    pub total_s: f64,
    /// CPUs online as `/init` counted them.
    pub cpus_online: Option<u32>,
    /// Exits by kind, all vCPUs: stage-2 faults, MMIO, HVC, system
    /// register traps, interrupts.
    pub exits: [u64; 5],
    /// The same per vCPU, in vCPU order.
    pub vcpu_exits: Vec<[u64; 5]>,
    /// Host ns in the engine's fault path, in device models, and answering
    /// exits (both included).
    pub engine_ns: u64,
    /// See `engine_ns`.
    pub device_ns: u64,
    /// See `engine_ns`.
    pub host_ns: u64,
    /// Exceptions injected into the guest instead of stopping the VM
    /// (`linux::inject`), all vCPUs.
    pub injected: u64,
    /// Exits the stub answered and counter ticks it spent on them at EL2.
    pub stub_exits: u64,
    /// See `stub_exits`, in ns.
    pub stub_ns: u64,
    /// Stage-2 abort exits the host's engine answered (the host
    /// placement; MMIO and injected exceptions not counted), all vCPUs.
    pub s2_round_trips: u64,
    /// Their time from the vector's entry to the return to the guest, in
    /// ns (the stub's counter).
    pub s2_round_trip_ns: u64,
    /// Stage-2 aborts answered at EL2 without an exit (the EL2
    /// placement; 0 under the host one), all vCPUs.
    pub el2_faults: u64,
    /// Their time at EL2, from the vector's entry to the return to the
    /// guest, in ns.
    pub el2_fault_ns: u64,
    /// EL2's own counters at the end (the EL2 placement), or why they
    /// could not be read.
    pub el2_counters: Option<std::result::Result<s2mmu_el2::Counters, String>>,
    /// What the console printed (the last 4 MiB).
    pub console: String,
    /// The host's log lines (unclaimed accesses and the like).
    pub log: Vec<String>,
    /// The dirty-log harvests and their check (`None` without logging).
    pub dirty: Option<HarvestReport>,
    /// The engine's TLB maintenance: in fault answers, on the service CPU.
    pub tlbi: crate::tlbi::TlbiCounters,
    /// Every vCPU's exits together by kind ([`EXIT_NAMES`]), counted from
    /// the start, every [`EXIT_SAMPLE`] (at most [`MAX_EXIT_SAMPLES`]), with
    /// the seconds since the start.
    pub exit_samples: Vec<ExitSample>,
    /// Boots after the first (`reboot::run_rebooting`; 0 from [`run`]).
    pub reboots: u32,
}

/// Seconds since the start, and every vCPU's exits by kind until then.
pub type ExitSample = (f64, [u64; 5]);

/// How often [`LinuxReport::exit_samples`] counts the exits.
pub const EXIT_SAMPLE: Duration = Duration::from_millis(100);
/// The most samples [`LinuxReport::exit_samples`] keeps (an hour's).
pub const MAX_EXIT_SAMPLES: usize = 36_000;

/// Exit kind names in [`LinuxReport::exits`] order.
pub const EXIT_NAMES: [&str; 5] = ["stage2_fault", "mmio", "hvc", "sysreg", "irq"];

pub(crate) fn check(cfg: &LinuxConfig) -> Result<()> {
    if !(1..=MAX_VCPUS).contains(&cfg.vcpus) {
        return Err(Arm64Error::Config(format!(
            "vCPUs {} outside 1..={MAX_VCPUS}",
            cfg.vcpus
        )));
    }
    if !(MIN_MEM..=MAX_MEM).contains(&cfg.mem) || !cfg.mem.is_multiple_of(2 << 20) {
        return Err(Arm64Error::Config(format!(
            "guest RAM of {} bytes: must be a multiple of 2 MiB in {}M..={}G",
            cfg.mem,
            MIN_MEM >> 20,
            MAX_MEM >> 30
        )));
    }
    cfg.dirty
        .change
        .check(cfg.dirty.mode)
        .map_err(Arm64Error::Config)?;
    Ok(())
}

/// Boots the guest and runs it until it powers off, resets, fails or runs
/// out of time (`reboot::run_rebooting` boots it again on a reset).
///
/// # Errors
/// [`Arm64Error::Config`] for a bad configuration (before QEMU starts);
/// [`Arm64Error::Io`] for unreadable kernel or initrd files; the machine's
/// and the engine's errors. A guest that stops for a reason other than
/// SYSTEM_OFF is a report with that reason, not an error.
pub fn run(cfg: &LinuxConfig) -> Result<LinuxReport> {
    run_with(cfg, false)
}

/// As [`run`], with the operator's stdin forwarded to the guest's UART
/// ([`crate::linux::console_input`]): `Ctrl-A x` stops the VM
/// ([`StopReason::Escape`]). The caller puts a terminal into raw mode
/// ([`crate::linux::console_input::RawTerminal`]) if it wants every key
/// to reach the guest.
///
/// # Errors
/// As [`run`].
pub fn run_interactive(cfg: &LinuxConfig) -> Result<LinuxReport> {
    run_with(cfg, true)
}

fn run_with(cfg: &LinuxConfig, interactive: bool) -> Result<LinuxReport> {
    check(cfg)?;
    for p in [&cfg.kernel, &cfg.initrd] {
        std::fs::metadata(p).map_err(|e| Arm64Error::Io(format!("{}: {e}", p.display())))?;
    }
    let t0 = Instant::now();
    let (vm, dl, boot) = prepare(cfg)?;
    let console = ConsoleBuffer::new(4 << 20);
    let (sh, uart) = shared(cfg, vm, dl, &boot, &console);
    let input = if interactive {
        Some(spawn_input(sh.clone(), uart).map_err(Arm64Error::Io)?)
    } else {
        None
    };
    let init_at = watch_init(&console, t0);
    let sampler = spawn_exit_sampler(sh.clone(), t0).map_err(Arm64Error::Io)?;
    crate::linux::shared::spawn_watchdog(&sh).map_err(Arm64Error::Io)?;
    let harvester = cfg
        .dirty
        .mode
        .is_some()
        .then(|| spawn_harvester(sh.clone(), console.clone(), cfg.dirty, cfg.mem));
    let mut threads = Vec::new();
    let mut first_err = None;
    for id in 0..cfg.vcpus {
        let s = sh.clone();
        match std::thread::Builder::new()
            .name(format!("linux-vcpu{id}"))
            .spawn(move || vcpu::vcpu_thread(&s, id))
        {
            Ok(t) => threads.push(t),
            Err(e) => {
                sh.stop(StopReason::Error(format!("vCPU thread: {e}")));
                first_err = Some(Arm64Error::Io(format!("vCPU thread: {e}")));
                break;
            }
        }
    }
    for t in threads {
        if let Err(e) = t.join().expect("vCPU thread panicked") {
            first_err.get_or_insert(e);
        }
    }
    sh.cpus.watch.join();
    if let Some(t) = input {
        let _ = t.join();
    }
    let total_s = t0.elapsed().as_secs_f64();
    let dirty = match harvester.map(|h| h.join().expect("harvester panicked")) {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => return Err(e),
        None => None,
    };
    if let Some(e) = first_err {
        return Err(e);
    }
    let mut r = report(&sh, &console, &init_at, total_s);
    r.dirty = dirty;
    r.exit_samples = sampler.join().unwrap_or_default();
    Ok(r)
}

/// Starts the machine, makes the VM with its RAM slot, and loads the
/// kernel, initramfs and device tree.
fn prepare(cfg: &LinuxConfig) -> Result<(Host, DeviceLayout, BootLayout)> {
    let ram_bytes = cfg.mem + cfg.dirty.change.spare_bytes();
    let mc = MachineConfig {
        cpus: cfg.vcpus + 1,
        data_bytes: ram_bytes,
        ram_pages: cfg.ram_pages,
    };
    let (machine, vm) = match cfg.engine {
        Engine::Host => {
            let machine = Arc::new(Machine::start(&mc)?);
            let vm = Arm64Vm::new_bare(
                machine.clone(),
                &VmConfig {
                    policy: cfg.dirty.policy(),
                    ..VmConfig::default()
                },
            )?;
            (machine, Host::Host(vm))
        }
        Engine::El2 => {
            let mc = MachineConfig {
                data_bytes: ram_bytes + el2p::SHARED_BYTES + el2p::TRACE_BYTES,
                ..mc
            };
            let machine = Arc::new(Machine::start_with(&mc, crate::image_el2()?)?);
            let vm = El2Vm::new(machine.clone(), cfg.dirty.mode, cfg.vcpus, ram_bytes)?;
            (machine, Host::El2(vm))
        }
    };
    vm.add_slot(RAM_SLOT, RAM_IPA, layout::DATA, cfg.mem, 2 << 20)?;
    let fdt_base = FdtConfig::virt(cfg.mem, cfg.vcpus as u32, "");
    let dl = DeviceLayout {
        gicd: fdt_base.gicd.0,
        gicr: fdt_base.gicr.0,
        uart: fdt_base.uart.0,
        uart_spi: fdt_base.uart.2,
    };
    let bootargs = format!(
        "console=ttyS0 earlycon=uart8250,mmio,{:#x} {}",
        dl.uart, cfg.cmdline
    );
    let mut ram = SlotRam {
        ram: machine.ram(),
        size: cfg.mem,
    };
    let mut f = FdtConfig::virt(cfg.mem, cfg.vcpus as u32, &bootargs);
    f.gicr.1 = GICR_STRIDE * cfg.vcpus as u64;
    crate::linux::changes::add_framebuffer(&vm, cfg.dirty.change, cfg.mem, &mut f)?;
    let files = LinuxAssets {
        image: cfg.kernel.clone(),
        initramfs: cfg.initrd.clone(),
        kernel_version: String::new(),
    };
    let boot = boot::load_linux(&mut ram, &files, &f)
        .map_err(|e| Arm64Error::Config(format!("loading the kernel: {e}")))?;
    Ok((vm, dl, boot))
}

/// What the vCPU threads share: the UART on the bus, its interrupt raised
/// in the GIC, vCPU 0 about to start at the kernel's entry.
fn shared(
    cfg: &LinuxConfig,
    vm: Host,
    dl: DeviceLayout,
    boot: &BootLayout,
    console: &ConsoleBuffer,
) -> (Arc<Shared>, Arc<Uart>) {
    let limit = Arc::new(crate::linux::dirty_limit::DirtyLimit::new(cfg.vcpus));
    limit.attach(&vm);
    let mut made = None;
    let sh = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| {
        let w = weak.clone();
        let intid = 32 + dl.uart_spi;
        let irq: crate::linux::uart::IrqCallback = Arc::new(move || {
            if let Some(sh) = w.upgrade() {
                sh.raise(0, intid);
            }
        });
        let out = if cfg.echo {
            UartOutput::BufferAndStdout(console.clone())
        } else {
            UartOutput::Buffer(console.clone())
        };
        let uart = Arc::new(Uart::new(irq, out));
        made = Some(uart.clone());
        let devices = DeviceSet::new(dl, Gic::new(cfg.vcpus), uart, VirtualTimer::new())
            .expect("the virt machine's device ranges are apart");
        let mut start = vec![None; cfg.vcpus];
        start[0] = Some((boot.entry, boot.dtb));
        let mut state = vec![PowerState::Off; cfg.vcpus];
        state[0] = PowerState::OnPending;
        Shared {
            vm,
            devices,
            cpus: VcpuControl::new(Power { state, start }, Instant::now() + cfg.timeout),
            faults: RamFaults::new(limit),
            host_log: HostLog::new(cfg.vcpus),
        }
    });
    (sh, made.expect("the UART is made with the VM"))
}

/// The console's input thread: stdin to the UART until the VM stops;
/// `Ctrl-A x` stops it. End of input ends the thread, not the VM.
fn spawn_input(
    sh: Arc<Shared>,
    uart: Arc<Uart>,
) -> std::result::Result<std::thread::JoinHandle<()>, String> {
    use crate::linux::console_input::{read_stdin, EscapeFilter};
    std::thread::Builder::new()
        .name("linux-console-in".into())
        .spawn(move || {
            let (mut filter, mut buf, mut out) = (EscapeFilter::default(), [0u8; 256], Vec::new());
            while !sh.stopping() {
                let n = match read_stdin(&mut buf, Duration::from_millis(100)) {
                    Ok(None) => continue,
                    Ok(Some(n)) if n > 0 => n,
                    _ => return,
                };
                out.clear();
                let stop = filter.feed(&buf[..n], &mut out);
                let mut rest = &out[..];
                while !rest.is_empty() && !sh.stopping() {
                    let k = uart.enqueue(rest);
                    rest = &rest[k..];
                    if k == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                if stop {
                    sh.stop(StopReason::Escape);
                }
            }
        })
        .map_err(|e| format!("console input thread: {e}"))
}

/// The harvester's thread: logging starts under the running system (its
/// RAM mapped in blocks, so the eager split runs), after the boot is
/// timed, once `/init` prints its line.
fn spawn_harvester(
    sh: Arc<Shared>,
    console: ConsoleBuffer,
    hc: HarvestConfig,
    mem: u64,
) -> std::thread::JoinHandle<Result<HarvestReport>> {
    std::thread::spawn(move || {
        while console
            .wait_until(Duration::from_millis(100), |s| s.contains(INIT_LINE))
            .is_none()
        {
            if sh.stopping() {
                return Ok(HarvestReport::default());
            }
        }
        let r = dirty::run_harvester(&sh, &hc, mem);
        if let Err(e) = &r {
            sh.stop(StopReason::Error(format!("harvester: {e}")));
        }
        r
    })
}

/// A thread that notes when the init line appears on the console.
pub(crate) fn watch_init(console: &ConsoleBuffer, t0: Instant) -> Arc<Mutex<Option<f64>>> {
    let at = Arc::new(Mutex::new(None));
    let (c, a) = (console.clone(), at.clone());
    std::thread::spawn(move || {
        if c.wait_until(Duration::from_secs(3600), |s| s.contains(INIT_LINE))
            .is_some()
        {
            *a.lock().unwrap() = Some(t0.elapsed().as_secs_f64());
        }
    });
    at
}

/// vCPU `id`'s stage-2 fault counts and ticks: the host's round trips,
/// then those answered at EL2.
fn fault_ticks(sh: &Shared, id: usize) -> [u64; 4] {
    let m = sh.vm.machine().mailbox(id);
    let (n, t) = match &sh.vm {
        Host::El2(v) => v.el2_faults(id),
        Host::Host(_) => (0, 0),
    };
    [
        m.read(layout::mb::S2_EXITS),
        m.read(layout::mb::S2_TICKS),
        n,
        t,
    ]
}

pub(crate) fn report(
    sh: &Shared,
    console: &ConsoleBuffer,
    init_at: &Mutex<Option<f64>>,
    total_s: f64,
) -> LinuxReport {
    let text = console.contents();
    let cpus_online = text.lines().find_map(|l| {
        l.split(INIT_LINE)
            .nth(1)
            .and_then(|r| r.trim().parse::<u32>().ok())
    });
    let mut exits = [0u64; 5];
    let (mut engine_ns, mut device_ns, mut host_ns, mut injected) = (0, 0, 0, 0);
    let (mut stub_exits, mut stub_ticks) = (0, 0);
    let (mut el2_faults, mut el2_ticks) = (0, 0);
    let (mut s2_trips, mut s2_ticks) = (0, 0);
    for (id, s) in sh.host_log.stats.iter().enumerate() {
        for (k, e) in exits.iter_mut().enumerate() {
            *e += s.exits[k].load(Ordering::Relaxed);
        }
        engine_ns += s.engine_ns.load(Ordering::Relaxed);
        device_ns += s.device_ns.load(Ordering::Relaxed);
        host_ns += s.host_ns.load(Ordering::Relaxed);
        injected += s.injected.load(Ordering::Relaxed);
        let (n, t) = sh.vm.machine().mailbox(id).exit_stats();
        stub_exits += n;
        stub_ticks += t;
        let f = fault_ticks(sh, id);
        s2_trips += f[0];
        s2_ticks += f[1];
        el2_faults += f[2];
        el2_ticks += f[3];
    }
    // The counter runs at CNTFRQ (QEMU: 62.5 MHz).
    let freq = sh
        .vm
        .machine()
        .mailbox(sh.devices.gic.vcpus())
        .command(layout::CMD_PING, &[])
        .unwrap_or(62_500_000)
        .max(1);
    LinuxReport {
        reason: sh.cpus.stop_reason().unwrap_or(StopReason::PowerOff),
        init_s: *init_at.lock().unwrap(),
        total_s,
        cpus_online,
        exits,
        vcpu_exits: sh.host_log.exits(),
        engine_ns,
        device_ns,
        host_ns,
        injected,
        stub_exits,
        stub_ns: (stub_ticks as u128 * 1_000_000_000 / freq as u128) as u64,
        s2_round_trips: s2_trips,
        s2_round_trip_ns: (s2_ticks as u128 * 1_000_000_000 / freq as u128) as u64,
        el2_faults,
        el2_fault_ns: (el2_ticks as u128 * 1_000_000_000 / freq as u128) as u64,
        el2_counters: match &sh.vm {
            Host::El2(v) => Some(v.counters().map_err(|e| e.to_string())),
            Host::Host(_) => None,
        },
        console: text,
        log: sh.host_log.lines(),
        dirty: None,
        tlbi: sh.vm.sink().counters(),
        exit_samples: Vec::new(),
        reboots: 0,
    }
}

/// Every vCPU's exits by kind, now.
fn exits_now(sh: &Shared) -> [u64; 5] {
    std::array::from_fn(|k| {
        sh.host_log
            .stats
            .iter()
            .map(|s| s.exits[k].load(Ordering::Relaxed))
            .sum()
    })
}

/// Counts the exits every [`EXIT_SAMPLE`] until the VM stops.
fn spawn_exit_sampler(
    sh: Arc<Shared>,
    t0: Instant,
) -> std::result::Result<std::thread::JoinHandle<Vec<ExitSample>>, String> {
    std::thread::Builder::new()
        .name("linux-exit-samples".into())
        .spawn(move || {
            let mut v = Vec::new();
            while !sh.stopping() && v.len() < MAX_EXIT_SAMPLES {
                std::thread::sleep(EXIT_SAMPLE);
                v.push((t0.elapsed().as_secs_f64(), exits_now(&sh)));
            }
            v
        })
        .map_err(|e| format!("exit sampler thread: {e}"))
}
