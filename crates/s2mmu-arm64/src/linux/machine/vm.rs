//! A Linux VM on the arm64 model: Debian's kernel at EL1 under the EL2
//! stub, every byte of its RAM mapped by the engine's fault path, its
//! interrupt controller, UART and PSCI on the host. [`run`] boots one
//! ([`LinuxVm`]'s lifecycle: blank, load, start), watches it until it
//! stops (the dirty-log harvester, the exit sampler, the console's input)
//! and reports what it measured.

use crate::layout;
use crate::linux::dirty::{self, HarvestConfig, HarvestReport, RunState};
use crate::linux::lifecycle::LinuxVm;
use crate::linux::spec::EngineSpec;
use crate::linux::uart::{ConsoleBuffer, Uart};
use crate::{Arm64Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::linux::config::{LinuxConfig, MAX_MEM, MAX_VCPUS, MIN_MEM};
pub use crate::linux::devices::timer::CNTHCTL_LINUX;
pub use crate::linux::placement::Engine;
pub(crate) use crate::linux::shared::Shared;
pub use crate::linux::shared::{DeviceLayout, StopReason, HCR_LINUX, RAM_IPA, RAM_SLOT};
/// The console line `/init` prints once every CPU it counts is online.
pub const INIT_LINE: &str = "s2mmu-init: cpus online ";

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
    crate::linux::config::check(cfg)?;
    for p in [&cfg.kernel, &cfg.initrd] {
        std::fs::metadata(p).map_err(|e| Arm64Error::Io(format!("{}: {e}", p.display())))?;
    }
    let t0 = Instant::now();
    let spec = EngineSpec::harvested(cfg.engine, cfg.ram_pages, &cfg.dirty);
    let mut lv = LinuxVm::new_blank(cfg, spec)?;
    lv.load_and_start(cfg)?;
    let console = lv.console().clone();
    let (sh, uart) = {
        let r = lv.running()?;
        (r.sh.clone(), r.uart.clone())
    };
    let init_at = watch_init(&console, t0);
    let watchers = Watchers::spawn(&sh, uart, &console, cfg, interactive, t0);
    let stopped = lv.wait_stopped();
    let total_s = t0.elapsed().as_secs_f64();
    let (dirty, samples) = watchers.join(&sh)?;
    stopped?;
    let mut r = report(&sh, &console, &init_at, total_s);
    r.dirty = dirty;
    r.exit_samples = samples;
    Ok(r)
}

/// The threads that watch a run beside its vCPUs.
struct Watchers {
    input: Option<std::thread::JoinHandle<()>>,
    sampler: Option<std::thread::JoinHandle<Vec<ExitSample>>>,
    harvester: Option<std::thread::JoinHandle<Result<HarvestReport>>>,
    /// A thread that did not start (the VM is stopped with it).
    failed: Option<Arm64Error>,
}

impl Watchers {
    /// The console's input (`interactive`), the exit sampler and the
    /// dirty-log harvester (if `cfg` logs); one that does not start stops
    /// the VM.
    fn spawn(
        sh: &Arc<Shared>,
        uart: Arc<Uart>,
        console: &ConsoleBuffer,
        cfg: &LinuxConfig,
        interactive: bool,
        t0: Instant,
    ) -> Watchers {
        let mut failed = None;
        let input = if interactive {
            started(sh, &mut failed, spawn_input(sh.clone(), uart))
        } else {
            None
        };
        let sampler = started(sh, &mut failed, spawn_exit_sampler(sh.clone(), t0));
        let harvester = cfg
            .dirty
            .mode
            .is_some()
            .then(|| spawn_harvester(sh.clone(), console.clone(), cfg.dirty, cfg.mem));
        Watchers {
            input,
            sampler,
            harvester,
            failed,
        }
    }

    /// Joins them once the VM has stopped: the harvests and the exit
    /// samples.
    ///
    /// # Errors
    /// The harvester's error; a thread that did not start.
    fn join(self, sh: &Shared) -> Result<(Option<HarvestReport>, Vec<ExitSample>)> {
        debug_assert!(sh.stopping());
        if let Some(t) = self.input {
            let _ = t.join();
        }
        let samples = self
            .sampler
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let dirty = match self.harvester.map(|h| h.join()) {
            Some(Ok(Ok(r))) => Some(r),
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(_)) => return Err(Arm64Error::Guest("the harvester panicked".into())),
            None => None,
        };
        match self.failed {
            Some(e) => Err(e),
            None => Ok((dirty, samples)),
        }
    }
}

/// A watcher's thread, or `None` with the VM stopped and the first
/// such failure kept in `failed`.
fn started<T>(
    sh: &Shared,
    failed: &mut Option<Arm64Error>,
    r: std::result::Result<T, String>,
) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(e) => {
            sh.stop(StopReason::Error(e.clone()));
            failed.get_or_insert(Arm64Error::Io(e));
            None
        }
    }
}

impl RunState for Shared {
    fn stopping(&self) -> bool {
        Shared::stopping(self)
    }
    fn stop(&self, why: StopReason) {
        Shared::stop(self, why)
    }
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
        let r = dirty::run_harvester(&*sh.vm, &sh.faults, &*sh, &hc, mem);
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
    let (n, t) = sh.vm.el2().map_or((0, 0), |v| v.el2_faults(id));
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
        el2_counters: sh.vm.el2().map(|v| v.counters().map_err(|e| e.to_string())),
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
