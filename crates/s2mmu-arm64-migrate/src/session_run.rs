//! A whole migration of the Linux guest, as `s2mmu migrate --guest linux`
//! runs it: machine A booted with a guest program, its guest moved to B
//! through the migration library's session (pre-copy, or post-copy: B's
//! stage-2 fault on a page not yet there is its request), in one process
//! or to another, and the proof the guest went on: B's console continues
//! A's counter (or B's dirtier prints `ok`), and A's never prints again.
//! The settings are plain values ([`RunSettings`]); the caller parses
//! flags into them and prints what it gets back ([`LinuxRun`], [`Listened`]).

use crate::console_gap::{printed, ConsoleGap};
pub use crate::run_error::LinuxRunError;
pub use crate::run_figures::{LinuxRun, RunDetails, WentOn};
use crate::session_dest::LinuxDest;
use crate::session_source::{LinuxSessionVm, LinuxSource};
use crate::source_resume;
use s2mmu_arm64::linux::assets::LinuxAssets;
use s2mmu_arm64::linux::dirty_limit::DirtyLimitCounters;
use s2mmu_arm64::linux::migrate::{LinuxVm, RestoreClock};
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_arm64::machine::{RamBacking, RamPages};
use s2mmu_migrate::session::both_ends::run_both_ends;
use s2mmu_migrate::session::dest::{serve_with, DestConfig, DestOutcome};
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::postcopy::Postcopy;
use s2mmu_migrate::session::source::{run_source, Harvest, SourceConfig, SourceOutcome};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self as net, NetConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::console_watch::{begun_steps, steps, unfinished_line, wait_for};

/// The dirtier's arguments: 64 MiB of anonymous memory and 8 of tmpfs,
/// written as fast as it can (rate 0) for 30 s.
const DIRTIER_ARGS: &str = "mem=64,file=8,rate=0,secs=30";

/// The guest program the guest runs (its `s2mmu.run=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestProgram {
    /// `counter`: one small step a second, each step's number and a
    /// running hash printed; the destination must print the next step.
    Counter,
    /// `dirtier`: writes as fast as it can and re-checks every page; the
    /// destination must print its `ok`.
    Dirtier,
    /// `fill`: fills 90 % of the guest's available memory with data pages
    /// (none zero, none alike), then steps as `counter` does, re-checking a
    /// 64th of its pages a step; the destination must print the next step.
    Fill,
    /// The user's own (their kernel command line and initramfs): the
    /// source migrates once it printed a line that is not a kernel
    /// message; the destination's guest must print one of its own.
    User,
}

impl GuestProgram {
    /// Whether the program prints the counter's steps.
    pub fn counts(self) -> bool {
        matches!(self, GuestProgram::Counter | GuestProgram::Fill)
    }
}

/// When the session switches to post-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostcopyMode {
    /// Post-copy after round 0 (one pre-copy pass).
    On,
    /// Post-copy from the start: no page sent before the switch, every
    /// page missing on the destination.
    Start,
    /// Pre-copy as the session's policy says, post-copy if it does not
    /// converge.
    Auto,
}

/// What a run needs: the guest, and the session's settings as the flags
/// give them (the simulated guest's; [`session_config`] and
/// [`dest_config`] adapt them to the Linux VM).
#[derive(Clone)]
pub struct RunSettings {
    /// vCPUs of the guest.
    pub vcpus: usize,
    /// Guest RAM in bytes.
    pub mem: u64,
    /// The program the guest runs.
    pub program: GuestProgram,
    /// `None`: pre-copy only; otherwise when the session switches to
    /// post-copy (it overrides `session.postcopy`).
    pub postcopy: Option<PostcopyMode>,
    /// The source's session settings.
    pub session: SourceConfig,
    /// The destination's settings.
    pub dest: DestConfig,
    /// How connections are secured.
    pub net: NetConfig,
    /// Sources a listening destination serves before it gives up.
    pub attempts: u32,
    /// Which host pages back both machines' RAM.
    pub ram_pages: RamPages,
    /// Where both machines' engines run (a listening destination: its own).
    pub engine: s2mmu_arm64::linux::vm::Engine,
    /// The source logs by hardware dirty state instead of write protection.
    pub hardware_dirty: bool,
}

/// What a listening destination received and saw.
#[derive(Clone, Debug)]
pub struct Listened {
    /// The session's outcome on this side.
    pub outcome: DestOutcome,
    /// How the destination's guest went on: the first counter step it
    /// began, or the dirtier's `ok`.
    pub went_on: WentOn,
    /// Counter steps begun after the first, in order (0 for the dirtier).
    pub more_steps: usize,
    /// The destination console's first line, `'\r'` dropped: the end of
    /// a line the switch cut, when it cut one ([`unfinished_line`]).
    pub first_line: String,
    /// The destination's console once its guest went on.
    pub console: String,
}

/// What a listening destination reports while it serves.
#[derive(Debug)]
pub enum ListenEvent<'a> {
    /// Bound, serving from now on.
    Listening {
        /// The address bound.
        addr: &'a str,
        /// The settings it serves with.
        dest: &'a DestConfig,
    },
    /// An attempt failed (`failures` so far); the next source is served.
    AttemptFailed {
        /// Failed attempts so far.
        failures: u32,
        /// Why this one failed.
        error: String,
    },
}

/// The machine's settings for `s`: its program on the kernel command line, its log off.
pub fn linux_config(s: &RunSettings, a: &LinuxAssets) -> LinuxConfig {
    let run = match s.program {
        GuestProgram::Dirtier => format!("s2mmu.run=dirtier s2mmu.args={DIRTIER_ARGS}"),
        GuestProgram::Counter => "s2mmu.run=counter s2mmu.args=kib=4,ms=1000".to_string(),
        GuestProgram::Fill => "s2mmu.run=fill s2mmu.args=pct=90,ms=1000".to_string(),
        GuestProgram::User => String::new(),
    };
    let dirty = s2mmu_arm64::linux::dirty::HarvestConfig {
        mode: s.hardware_dirty.then_some(s2mmu::mmu::DirtyMode::HW),
        ..Default::default()
    };
    LinuxConfig {
        vcpus: s.vcpus,
        mem: s.mem,
        kernel: a.image.clone(),
        initrd: a.initramfs.clone(),
        cmdline: format!("quiet {run}"),
        echo: false,
        timeout: Duration::from_secs(3600),
        dirty,
        ram_pages: s.ram_pages,
        engine: s.engine,
    }
}

/// The session's settings of `s` with the harvest the Linux VM's dirty log
/// needs (GET and CLEAR of bitmaps) and `s.postcopy`'s switch.
pub fn session_config(s: &RunSettings) -> SourceConfig {
    let mut cfg = s.session.clone();
    cfg.harvest = Harvest::Bitmap;
    cfg.postcopy = match s.postcopy {
        None => Postcopy::Off,
        Some(PostcopyMode::On) => Postcopy::On,
        Some(PostcopyMode::Start) => Postcopy::Start,
        Some(PostcopyMode::Auto) => Postcopy::Auto,
    };
    cfg
}

/// The destination's settings of `s`: no prefault (its RAM is QEMU's file).
pub fn dest_config(s: &RunSettings) -> DestConfig {
    let mut d = s.dest.clone();
    d.prefault = false;
    d
}

/// [`LinuxRunError::Machine`] of `machine` with `error`.
fn machine(machine: &'static str, error: impl std::fmt::Display) -> LinuxRunError {
    LinuxRunError::Machine {
        machine,
        error: error.to_string(),
    }
}

/// [`LinuxRunError::Session`] of `side` with `error`.
fn session(side: &'static str, error: MigrateError) -> LinuxRunError {
    LinuxRunError::Session { side, error }
}

fn dest_factory(cfg: &LinuxConfig) -> Arc<LinuxDest> {
    let mut dest = LinuxDest::new(cfg.echo, cfg.timeout);
    (dest.ram_pages, dest.engine) = (cfg.ram_pages, cfg.engine);
    Arc::new(dest)
}

/// A run's figures from the session's outcome; `state_bytes`: the STATE
/// body's size.
fn session_run(
    ram: (RamBacking, Option<RamBacking>),
    s: &SourceOutcome,
    state_bytes: usize,
    limit: DirtyLimitCounters,
    dest: Option<(DestOutcome, RestoreClock)>,
) -> LinuxRun {
    let (pre, fin): (Vec<_>, Vec<_>) = s.rounds.iter().partition(|r| !r.final_round);
    let to_first_instruction = dest
        .as_ref()
        .and_then(|(d, _)| Some(d.resumed_at?.saturating_duration_since(s.pause_at?)));
    LinuxRun {
        downtime: s.downtime,
        to_first_instruction,
        pause_unix_ns: s.pause_at.map_or(0, unix_ns),
        total: s.total,
        setup: s.setup,
        to_last_byte_sent: s.to_last_byte_sent(),
        precopy: Duration::from_secs_f64((s.pause_s - s.log_start_s).max(0.0)),
        stream_bytes: s.bytes,
        compression: s.compression,
        compressed: s.compressed,
        round_pages: pre.iter().map(|r| r.pages).collect(),
        round_ms: pre.iter().map(|r| (r.end_s - r.start_s) * 1e3).collect(),
        final_pages: fin.iter().map(|r| r.pages).sum(),
        state_bytes,
        details: match &s.postcopy {
            Some(pc) => RunDetails::Postcopy {
                figures: pc.clone(),
                parts: s.downtime_parts,
                dest: dest.map(Box::new),
            },
            None => RunDetails::Session {
                outcome: Box::new(s.clone()),
                limit,
                dest: dest.map(Box::new),
            },
        },
        went_on: None,
        ram_a: ram.0,
        ram_b: ram.1,
        consoles: (String::new(), None),
        console_gap: ConsoleGap::default(),
    }
}

/// `at` on the host's real-time clock, in nanoseconds since the Unix
/// epoch (the clock the two processes of a migration share).
pub fn unix_ns(at: Instant) -> u64 {
    let wall = std::time::SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(std::time::UNIX_EPOCH);
    wall.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Boots machine A and waits until its guest program runs.
///
/// # Errors
/// [`LinuxRunError::Machine`] when the machine does not boot; as
/// [`wait_for`] when the program fails or does not start.
pub fn boot_source(s: &RunSettings, cfg: &LinuxConfig) -> Result<LinuxVm, LinuxRunError> {
    let a = LinuxVm::boot(cfg).map_err(|e| machine("machine A", e))?;
    if s.program == GuestProgram::Dirtier {
        wait_for(&a, "machine A", |t| {
            t.contains("s2mmu-dirtier: start").then_some(())
        })?;
        std::thread::sleep(Duration::from_secs(2));
    } else if s.program == GuestProgram::User {
        wait_for(&a, "machine A", |t| printed(t).map(|_| ()))?;
    } else {
        wait_for(&a, "machine A", |t| {
            steps(t).last().filter(|&&n| n >= 2).copied()
        })?;
    }
    Ok(a)
}

/// One migration in this process: boot A, run its program, move its guest
/// to B over loopback (pre- or post-copy as `s.postcopy` says), check that
/// B's guest goes on and A's not, shut B down.
///
/// # Errors
/// [`LinuxRunError::Machine`] for machine A failing;
/// [`LinuxRunError::SourceResumed`] (or `SourceStuck`) for a migration
/// that failed before B's guest ran (its cause inside): A's guest went on;
/// [`LinuxRunError::WentWrong`] and [`wait_for`]'s errors for a guest that
/// did not go on.
pub fn migrate_once(s: &RunSettings, cfg: &LinuxConfig) -> Result<LinuxRun, LinuxRunError> {
    let a = boot_source(s, cfg)?;
    let src = LinuxSource::new(a);
    let resumed = |e| source_resume::after_failure(s.program.counts(), &src, e);
    let (o, d, b) = in_process(s, &src, cfg).map_err(resumed)?;
    let mut a = src.vm().lock();
    let state_bytes = crate::state::save(&mut a).map_or(0, |v| v.len());
    let mut b = b.lock();
    let dest = Some((d, b.restore_clock()));
    let ram = (a.ram_backing().clone(), Some(b.ram_backing().clone()));
    let run = session_run(ram, &o, state_bytes, src.limit_counters(), dest);
    // The session ran B's guest for --run-after, then paused it.
    b.resume_vcpus().map_err(|e| machine("machine B", e))?;
    goes_on(s, &a, &mut b, run)
}

/// Waits for the dirtier's `ok` line on `vm`'s console (`what` names the
/// machine in errors).
fn dirtier_ok(vm: &LinuxVm, what: &'static str) -> Result<WentOn, LinuxRunError> {
    let ok = wait_for(vm, what, |t| {
        // Whole lines only: the console may be read mid-line.
        t[..t.rfind('\n').map_or(0, |i| i + 1)]
            .lines()
            .find(|l| l.contains("s2mmu-dirtier: ok"))
            .map(str::to_string)
    })?;
    Ok(WentOn::DirtierOk(ok.trim().to_string()))
}

/// Checks that B's guest goes on from where A's stopped, and A's not.
fn goes_on(
    s: &RunSettings,
    a: &LinuxVm,
    b: &mut LinuxVm,
    mut run: LinuxRun,
) -> Result<LinuxRun, LinuxRunError> {
    let a_text = a.console().contents();
    if s.program == GuestProgram::Dirtier {
        run.went_on = Some(dirtier_ok(b, "machine B")?);
    } else if s.program == GuestProgram::User {
        run.went_on = Some(WentOn::Printed(wait_for(b, "machine B", printed)?));
    } else {
        let at_switch = steps(&a_text).last().copied().unwrap_or(0);
        wait_for(b, "machine B", |t| {
            steps(t).last().filter(|&&n| n > at_switch).copied()
        })?;
        // A line the switch cut in two is whole only in A's text and B's
        // joined: every step once, in order, across the switch.
        let all = steps(&format!("{a_text}{}", b.console().contents()));
        if all.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(LinuxRunError::WentWrong(format!(
                "the guest's counter steps across the switch: {all:?}"
            )));
        }
        run.went_on = Some(WentOn::CounterStep(at_switch + 1));
    }
    if a.console().contents() != a_text {
        return Err(LinuxRunError::WentWrong(
            "A's guest printed after the switch".into(),
        ));
    }
    run.consoles = (a_text, Some(b.console().contents()));
    run.console_gap = ConsoleGap::of_machines(a, Some(&*b));
    b.shut_down().map_err(|e| machine("machine B", e))?;
    Ok(run)
}

/// One migration of `src` in this process: B built by the session from the
/// HEADER, both ends over loopback secured as `s.net` says.
fn in_process(
    s: &RunSettings,
    src: &LinuxSource,
    cfg: &LinuxConfig,
) -> Result<(SourceOutcome, DestOutcome, Arc<LinuxSessionVm>), LinuxRunError> {
    let scfg = session_config(s);
    let net = &s.net;
    let listener = net::bind("127.0.0.1:0").map_err(|error| LinuxRunError::Bind {
        addr: "127.0.0.1:0".into(),
        error,
    })?;
    let dcfg = dest_config(s);
    let factory = dest_factory(cfg);
    // B's QEMU starts now, not on the HEADER inside the source's deadline.
    factory
        .prestart(cfg.vcpus, cfg.mem)
        .map_err(|e| machine("machine B", e))?;
    let ends = run_both_ends(listener, factory.clone(), src, &scfg, &dcfg, net)
        .map_err(|e| LinuxRunError::Thread(e.to_string()))?;
    let o = ends.source.map_err(|error| session("source", error))?;
    let d = ends.dest.map_err(|error| session("destination", error))?;
    let b = factory.built().ok_or(LinuxRunError::NoGuest)?;
    Ok((o, d, b))
}

/// `--to ADDR`: migrates the guest `a` (booted here) to `addr`, calls
/// `sent` with the outcome, the last counter step A's guest began and
/// its console's [`unfinished_line`], then checks A's guest stays paused (it must never run again).
///
/// # Errors
/// [`LinuxRunError::SourceResumed`] (or [`LinuxRunError::SourceStuck`])
/// for a migration that failed (connecting included) while A's guest
/// still runs here: the session's error inside it;
/// [`LinuxRunError::Session`] for one that failed with A's guest kept
/// paused (post-copy's split); [`LinuxRunError::WentWrong`] when A's
/// guest printed after the switch.
pub fn source_to(
    s: &RunSettings,
    addr: &str,
    a: LinuxVm,
    sent: &mut dyn FnMut(&SourceOutcome, u64, &str),
) -> Result<LinuxRun, LinuxRunError> {
    let scfg = session_config(s);
    let net = &s.net;
    let src = LinuxSource::new(a);
    let o =
        run_source(&src, &scfg, &mut |_| connect_source(addr, &scfg, net)).map_err(|error| {
            source_resume::after_failure(s.program.counts(), &src, session("source", error))
        })?;
    let mut a = src.vm().lock();
    let text = a.console().contents();
    let last = begun_steps(&text).last().copied().unwrap_or(0);
    sent(&o, last, &unfinished_line(&text));
    std::thread::sleep(Duration::from_millis(500));
    if a.console().contents() != text {
        return Err(LinuxRunError::WentWrong(
            "the source's guest printed after the switch".into(),
        ));
    }
    let state_bytes = crate::state::save(&mut a).map_or(0, |v| v.len());
    let gap = ConsoleGap::of_machines(&a, None);
    let ram = (a.ram_backing().clone(), None);
    drop(a);
    let mut run = session_run(ram, &o, state_bytes, src.limit_counters(), None);
    run.consoles.0 = text;
    run.console_gap = gap;
    Ok(run)
}

/// One of the source's connections to the destination at `addr`, or,
/// after the operator's `recover ADDR` on the source's control socket
/// (`cfg.recovery.control`), at that ADDR: a post-copy recovery's
/// connections go where the operator says.
///
/// # Errors
/// As [`net::connect`] and [`net::client`]: the address cannot be
/// reached or the peer not authenticated.
pub fn connect_source(
    addr: &str,
    cfg: &SourceConfig,
    net: &NetConfig,
) -> Result<net::BoxConn, MigrateError> {
    let to = cfg.recovery.control.as_ref().and_then(|c| c.redirect());
    net::client(net::connect(to.as_deref().unwrap_or(addr), net)?, net)
}

/// `--listen ADDR`: serves one migration into a QEMU machine this process
/// starts from the HEADER (up to `s.attempts` sources), runs the guest on
/// and checks its counter goes on step by step (or, with the dirtier,
/// waits for its `ok`); `on` hears of the bind and of each failed attempt.
///
/// # Errors
/// [`LinuxRunError::Bind`], [`LinuxRunError::Machine`] (the blank machine
/// or the resumed guest), [`LinuxRunError::Attempts`] when every attempt
/// failed, [`LinuxRunError::WentWrong`] and [`wait_for`]'s errors when
/// the guest does not go on.
pub fn listen(
    s: &RunSettings,
    cfg: &LinuxConfig,
    addr: &str,
    on: &mut dyn FnMut(ListenEvent<'_>),
) -> Result<Listened, LinuxRunError> {
    let dcfg = dest_config(s);
    let listener = net::bind(addr).map_err(|error| LinuxRunError::Bind {
        addr: addr.into(),
        error,
    })?;
    // The blank machine of this side's --vcpus/--mem starts before the
    // source is told where to go (a HEADER of another shape starts its own).
    let factory = dest_factory(cfg);
    factory
        .prestart(cfg.vcpus, cfg.mem)
        .map_err(|e| machine("the destination", e))?;
    on(ListenEvent::Listening {
        addr: &listener.local(),
        dest: &dcfg,
    });
    let mut failures = 0;
    let outcome = loop {
        match serve_with(&*listener, &*factory, &dcfg, &s.net) {
            Ok(d) => break d,
            Err(e) => {
                failures += 1;
                if failures >= s.attempts {
                    return Err(LinuxRunError::Attempts {
                        failures,
                        attempts: s.attempts,
                        last: e,
                    });
                }
                let error = e.to_string();
                on(ListenEvent::AttemptFailed { failures, error });
                // The next attempt's machine starts now, not on its HEADER
                // inside the source's deadline for ACCEPT; the failed
                // attempt's machine (never resumed) goes first.
                factory.discard_built();
                factory
                    .prestart(cfg.vcpus, cfg.mem)
                    .map_err(|e| machine("the destination", e))?;
            }
        }
    };
    let b = factory.built().ok_or(LinuxRunError::NoGuest)?;
    let mut vm = b.lock();
    vm.resume_vcpus()
        .map_err(|e| machine("the destination's guest", e))?;
    let listened = dest_goes_on(s, &vm, outcome)?;
    vm.shut_down()
        .map_err(|e| machine("the destination's guest", e))?;
    Ok(listened)
}

/// How the resumed destination's guest went on: the dirtier's `ok`, or
/// two counter steps in order (the first, and how many after it), with
/// its console's first line.
fn dest_goes_on(
    s: &RunSettings,
    vm: &LinuxVm,
    outcome: DestOutcome,
) -> Result<Listened, LinuxRunError> {
    let first_line = vm
        .console()
        .contents()
        .split('\n')
        .next()
        .unwrap_or("")
        .replace('\r', "");
    let (went_on, more_steps) = if s.program == GuestProgram::Dirtier {
        (dirtier_ok(vm, "the destination")?, 0)
    } else if s.program == GuestProgram::User {
        let line = wait_for(vm, "the destination", printed)?;
        (WentOn::Printed(line), 0)
    } else {
        let first_step = wait_for(vm, "the destination", |t| {
            let s = begun_steps(t);
            (s.len() >= 2).then(|| s[0])
        })?;
        let steps = begun_steps(&vm.console().contents());
        if steps.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(LinuxRunError::WentWrong(format!(
                "the destination's counter skips: {steps:?}"
            )));
        }
        (WentOn::CounterStep(first_step), steps.len() - 1)
    };
    Ok(Listened {
        outcome,
        went_on,
        more_steps,
        first_line,
        console: vm.console().contents(),
    })
}
