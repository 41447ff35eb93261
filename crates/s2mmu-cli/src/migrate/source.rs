//! The source: runs the guest, logs its dirty pages and sends its memory in
//! pre-copy rounds until what is left fits the downtime budget, then pauses
//! it, sends the rest and the vCPU state, and waits for the destination to
//! resume it. Afterwards it checks the destination's memory against its own
//! (frozen) memory.
//!
//! Its parts: [`config`] (settings and checks), `sender` (pages onto the
//! channels), `precopy` (the round loop), `precopy_end` (where it left the
//! source, which both endings take), `stop_copy` (the stop, the
//! verification, the outcome), `postcopy_switch`, [`outcome`] and
//! `verify`.

use super::error::MigrateError;
use super::net::{BoxConn, Connection};
use super::postcopy::Postcopy;
use super::timeline::{intervals, Sample, Timeline};
use super::wire::{
    record_name, tag, Dec, Header, Record, WireReader, WireWriter, DEFAULT_GRACE, PAGE_SIZE,
    SESSION_LEN,
};
use crate::vm_format::FormatArg;
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Control, Vm, VmConfig, VmFormat, Workload, WorkloadConfig};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod config;
pub mod outcome;
mod postcopy_switch;
mod precopy;
mod precopy_end;
mod sender;
mod stop_copy;
mod verify;

pub use config::{source_policy, Converge, Harvest, SourceConfig};
pub use outcome::{Phase, RoundStat, SourceOutcome};
use precopy::Precopy;
use precopy_end::PrecopyEnd;
pub(crate) use sender::copy_page;
use sender::{Chan, Sender};
pub use verify::source_digests;

/// Opens the connection for a channel (0: the main one), secured as
/// configured.
pub type Connect<'a> = dyn FnMut(u16) -> Result<BoxConn, MigrateError> + 'a;

/// Runs the source side: `connect` opens each channel's connection once
/// the guest is warm.
///
/// # Errors
/// [`MigrateError::Setup`], [`MigrateError::Io`], [`MigrateError::Timeout`],
/// [`MigrateError::Auth`], [`MigrateError::NotConverged`] (the destination
/// was told to abort and the source guest kept running),
/// [`MigrateError::Rejected`], [`MigrateError::MemoryMismatch`].
pub fn migrate_source(
    cfg: &SourceConfig,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    config::validate(cfg)?;
    match cfg.format {
        FormatArg::Arm64 => migrate_source_on::<Arm64Stage2>(cfg, connect),
        FormatArg::Ept => migrate_source_on::<EptFormat>(cfg, connect),
    }
}

/// [`migrate_source`] on a guest whose tables are in format `F`.
fn migrate_source_on<F: VmFormat>(
    cfg: &SourceConfig,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    let (vm, wl, wl_cfg, pace) = start_guest::<F>(cfg)?;
    let ctl = wl.control().clone();
    ctl.pace_pages_per_sec.store(pace, Ordering::Relaxed);
    let timeline = Timeline::start(ctl.clone(), cfg.sample_every);
    wl.run_free();
    let warm = counters(&ctl);
    std::thread::sleep(cfg.warmup);
    let warm_end = counters(&ctl);
    let warm_end_s = timeline.at(warm_end.0);

    // Connect, be accepted, join the further channels, measure the link.
    let (session, chans, pc_conns) = connect_channels(cfg, &vm, connect)?;
    let mut s = Sender::new(&vm, chans, cfg);
    let (link_bytes, link) = probe_link(&mut s, cfg)?;

    // Pre-copy.
    let log_start = Instant::now();
    let log_start_s = timeline.at(log_start);
    let at_log = counters(&ctl);
    vm.enable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("enabling dirty logging: {e}")))?;
    let mut extras = cfg.extras.begin(&vm)?;
    let mut pre = Precopy::new(cfg, &ctl, &timeline, link, pace, log_start);
    let result = pre.run(&mut s, &mut extras);
    let Precopy {
        rounds,
        round,
        throttle_pct,
        max_throttle,
        switch,
        ..
    } = pre;
    let final_pace = ctl.pace_pages_per_sec.load(Ordering::Relaxed);
    if let Err(e) = result {
        return Err(abort(e, &mut s, &ctl, &vm));
    }
    let end = PrecopyEnd {
        vm: &vm,
        wl: &wl,
        wl_cfg,
        ctl: &ctl,
        s: &mut s,
        final_pace,
        round,
        max_throttle,
        rounds,
        timeline,
        log_start,
        log_start_s,
        warm,
        warm_end,
        warm_end_s,
        at_log,
        link,
        link_bytes,
        cfg,
    };
    if switch {
        return postcopy_switch::run(end, pc_conns, connect, session);
    }
    let outcome = stop_copy::run(end, extras, throttle_pct);
    drop(wl);
    outcome
}

/// The link figure before the migration (no guest, no checksum): bytes
/// sent and bytes per second.
///
/// # Errors
/// Sending or the destination's reply failed.
fn probe_link<F: VmFormat>(
    s: &mut Sender<'_, F>,
    cfg: &SourceConfig,
) -> Result<(u64, f64), MigrateError> {
    let (link_bytes, link_time) = s.probe(cfg.mem_size)?;
    let link = link_bytes as f64 / link_time.as_secs_f64().max(1e-9);
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}link: {:.1} MiB in {:.1} ms at {:.1} MiB/s over {} channel(s) (no guest, no checksum)",
            cfg.label,
            link_bytes as f64 / MIB,
            link_time.as_secs_f64() * 1e3,
            link / MIB,
            cfg.channels
        ));
    }
    Ok((link_bytes, link))
}

/// Pre-copy failed: the guest stays on the source. Tells the destination,
/// which must not resume it, lifts the throttle, stops dirty logging, and
/// returns the error to report (the destination's reason when it gave up).
fn abort<F: VmFormat>(
    e: MigrateError,
    s: &mut Sender<'_, F>,
    ctl: &Control,
    vm: &Vm<TreeMemslots, F>,
) -> MigrateError {
    ctl.throttle_ns.store(0, Ordering::Relaxed);
    let _ = vm.disable_dirty_logging();
    abort_and_reason(e, &mut s.chans[0].wire)
}

/// Sending failed before the stream's END: tells the destination with
/// ABORT on the main connection, then returns the error to report (the
/// destination's reason when it gave up, see [`rejected_or`]).
///
/// The ABORT is what ends the destination's wait on the main connection
/// when the failure was on a further channel (a page it found damaged
/// there): it then answers at once with REJECTED and its own reason.
/// Without it both sides wait out their I/O deadlines, and the source
/// reports its own broken channel instead of the destination's reason.
fn abort_and_reason(e: MigrateError, main: &mut WireWriter<BoxConn>) -> MigrateError {
    // Best effort: the main connection may be the one that failed.
    let _ = main.control(tag::ABORT, e.to_string().as_bytes());
    let _ = main.flush();
    rejected_or(e, main)
}

/// The source's guest, started and run once over all its memory (the
/// guest has been running: every page touched once), with the workload's
/// settings and its pace (pages per second per vCPU; 0 unpaced).
type StartedGuest<F> = (
    Arc<Vm<TreeMemslots, F>>,
    Workload<TreeMemslots, F>,
    WorkloadConfig,
    u64,
);

/// Creates the source's guest and its workload, and touches every page.
///
/// # Errors
/// [`MigrateError::Setup`] when the guest or its vCPUs cannot start.
fn start_guest<F: VmFormat>(cfg: &SourceConfig) -> Result<StartedGuest<F>, MigrateError> {
    let page = PAGE_SIZE as u64;
    let vm = Arc::new(
        Vm::<TreeMemslots, F>::new(VmConfig {
            mem_size: cfg.mem_size,
            backing: cfg.backing,
            slots: cfg.slots,
            gpa_base: 1 << 32,
            policy: source_policy(cfg),
            ..VmConfig::default()
        })
        .map_err(|e| MigrateError::Setup(format!("source guest: {e}")))?,
    );
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: cfg.mem_size / cfg.vcpus as u64 / page * page,
        write_percent: 100,
        pattern: cfg.pattern,
        page_size: page,
    };
    let wl = Workload::start(vm.clone(), cfg.vcpus, wl_cfg).map_err(MigrateError::Setup)?;
    // The guest has been running: every page touched once.
    wl.run_pass(|| {}).map_err(MigrateError::Setup)?;
    // 0 is unpaced: a rate below a page per second per vCPU is one.
    let pace = match cfg.dirty_rate {
        0 => 0,
        r => (r / page / cfg.vcpus as u64).max(1),
    };
    Ok((vm, wl, wl_cfg, pace))
}

/// The main connection (header sent, ACCEPT read), the further data
/// channels joined to its session, and post-copy's request and answer
/// connections after them when post-copy is on.
type Connected = ([u8; SESSION_LEN], Vec<Chan>, Vec<WireWriter<BoxConn>>);

/// Opens and joins every connection the run needs.
///
/// # Errors
/// Connecting or the handshake failed, or the destination did not accept.
fn connect_channels<F: VmFormat>(
    cfg: &SourceConfig,
    vm: &Vm<TreeMemslots, F>,
    connect: &mut Connect<'_>,
) -> Result<Connected, MigrateError> {
    let header = Header {
        mem_size: cfg.mem_size,
        slots: cfg.slots,
        gpa_base: vm.config().gpa_base,
        vcpus: cfg.vcpus as u32,
        channels: cfg.channels,
        backing: cfg.backing.name().to_string(),
        verify_full: cfg.verify_full,
        postcopy: cfg.postcopy != Postcopy::Off,
        format: cfg.format.into(),
    };
    let main = connect(0)?;
    let mut main = WireWriter::new(main, &header)?;
    main.flush()?;
    let session = match read_reply(&mut main, cfg.mem_size)? {
        Record::Control {
            tag: tag::ACCEPT,
            body,
            at_byte,
        } => {
            let mut d = Dec::new(&body, "ACCEPT", at_byte);
            let mut s = [0u8; SESSION_LEN];
            s.copy_from_slice(d.bytes(SESSION_LEN)?);
            d.finish()?;
            s
        }
        other => return Err(unexpected_reply(other, "ACCEPT")),
    };
    let mut chans = vec![Chan::new(main)];
    for c in 1..cfg.channels {
        let conn = connect(c)?;
        chans.push(Chan::new(WireWriter::join(conn, &session, c)?));
    }
    // Post-copy's request and answer connections, after the data channels.
    let mut pc_conns = Vec::new();
    if cfg.postcopy != Postcopy::Off {
        for c in [cfg.channels, cfg.channels + 1] {
            let conn = connect(c)?;
            pc_conns.push(WireWriter::join(conn, &session, c)?);
        }
    }
    Ok((session, chans, pc_conns))
}

/// The slowest a destination may back guest memory with RAM while it
/// answers PROGRESS before ACCEPT: past that, PROGRESS no longer proves
/// it is preparing.
pub(crate) const MIN_PREPARE_RATE: u64 = 32 << 20;

/// Reads the destination's next reply on the main connection, each
/// record within its deadline (the connection's I/O timeout as grace).
/// PROGRESS (the destination is still preparing `prepare_bytes` of guest
/// memory) is skipped: each one proves it alive within the I/O timeout,
/// but all of them together at most the I/O timeout plus `prepare_bytes`
/// at [`MIN_PREPARE_RATE`] (a destination answering PROGRESS for ever
/// does not hold the source for ever).
pub(crate) fn read_reply(
    w: &mut WireWriter<BoxConn>,
    prepare_bytes: u64,
) -> Result<Record, MigrateError> {
    let grace = w.get_mut().io_timeout().unwrap_or(DEFAULT_GRACE);
    let limit = grace + Duration::from_secs_f64(prepare_bytes as f64 / MIN_PREPARE_RATE as f64);
    let t0 = Instant::now();
    let mut rd = WireReader::replies(w.get_mut()).with_grace(grace);
    loop {
        match rd.next_record()? {
            Record::Control {
                tag: tag::PROGRESS, ..
            } if t0.elapsed() <= limit => {}
            Record::Control {
                tag: tag::PROGRESS, ..
            } => {
                return Err(MigrateError::Timeout {
                    what: format!(
                        "waiting for the destination's reply (it answered PROGRESS for {:?}, longer than preparing {prepare_bytes} bytes may take)",
                        t0.elapsed()
                    ),
                })
            }
            other => return Ok(other),
        }
    }
}

/// A reply that is not the one expected: REJECTED is the destination's
/// reason, anything else malformed.
pub(crate) fn unexpected_reply(r: Record, expected: &str) -> MigrateError {
    match r {
        Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        } => MigrateError::rejected(&body),
        other => MigrateError::Malformed {
            record: "reply",
            at_byte: 0,
            why: format!("expected {expected}, got {}", record_name(&other)),
        },
    }
}

const MIB: f64 = (1u64 << 20) as f64;

fn writes(c: &s2mmu_vm::Control) -> u64 {
    c.live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum()
}

/// The vCPUs' counters at an instant: time, guest writes, guest
/// execution nanoseconds.
fn counters(c: &s2mmu_vm::Control) -> (Instant, u64, u64) {
    (
        Instant::now(),
        writes(c),
        c.live
            .iter()
            .map(|l| l.guest_ns.load(Ordering::Relaxed))
            .sum(),
    )
}

/// The guest between two counter snapshots. The time per write is the
/// median over the timeline's intervals in the phase when it has at least
/// three (robust to a host that deschedules a vCPU now and then), else
/// the phase's mean.
fn phase(
    a: (Instant, u64, u64),
    b: (Instant, u64, u64),
    samples: &[Sample],
    from_s: f64,
    to_s: f64,
) -> Phase {
    let w = b.1.saturating_sub(a.1);
    let secs = (b.0 - a.0).as_secs_f64();
    if w == 0 || secs <= 0.0 {
        return Phase::default();
    }
    let per: Vec<f64> = intervals(samples)
        .iter()
        .filter(|i| i.start_s >= from_s && i.end_s <= to_s)
        .filter_map(|i| i.speed.map(|v| 1e9 / v))
        .collect();
    let ns_per_write = match crate::stats::median(&per) {
        Some(m) if per.len() >= 3 => m,
        _ => b.2.saturating_sub(a.2) as f64 / w as f64,
    };
    Phase {
        write_rate: w as f64 / secs,
        ns_per_write,
    }
}

/// When sending failed because the destination gave up, its reason is the
/// better error.
fn rejected_or(e: MigrateError, main: &mut WireWriter<BoxConn>) -> MigrateError {
    if !matches!(e, MigrateError::Io { .. }) {
        return e;
    }
    match read_reply(main, 0) {
        Ok(Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        }) => MigrateError::rejected(&body),
        _ => e,
    }
}
